class PostsController < ApplicationController
  # GET /posts: the 30 latest posts with their authors and comments, as
  # JSON (three queries: includes).
  def index
    Rbscope.truth(:index, caller_locations(0))
    posts = Post.recent.includes(:author, :comments).limit(30)
    render json: posts.as_json(
      only: %i[id title published_at],
      methods: :word_count,
      include: { author: { only: %i[id name] }, comments: { only: %i[id author_name body] } }
    )
  end

  # GET /page: the 10 latest posts as HTML, a partial per post and per
  # comment (rendered here, not after the action returns, so that the
  # rendering's stacks go through the action).
  def page
    Rbscope.truth(:page, caller_locations(0))
    @posts = Post.recent.includes(:author, :comments).limit(10)
    render :page
  end
end
