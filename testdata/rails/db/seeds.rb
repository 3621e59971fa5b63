# The same data on every build: 20 authors, 300 posts, 3000 comments.
rng = Random.new(42)
words = %w[ruby rails profiler stack frame thread sample puma sqlite query
           view partial render json garbage collector lock kernel memory time]
sentence = ->(n) { Array.new(n) { words[rng.rand(words.size)] }.join(" ").capitalize + "." }
t0 = Time.utc(2024, 1, 1)
ActiveRecord::Base.transaction do
  authors = Array.new(20) { |i| Author.create!(name: "Author #{i}", email: "author#{i}@example.test") }
  300.times do |i|
    post = Post.create!(author: authors[rng.rand(authors.size)], title: sentence.(5),
                        body: Array.new(8) { sentence.(12) }.join(" "), published_at: t0 + i * 3600)
    10.times { post.comments.create!(author_name: "Reader #{rng.rand(100)}", body: sentence.(10)) }
  end
end
