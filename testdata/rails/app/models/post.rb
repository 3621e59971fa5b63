class Post < ApplicationRecord
  belongs_to :author
  has_many :comments

  scope :recent, -> { order(published_at: :desc) }

  def word_count
    body.split.size
  end
end
