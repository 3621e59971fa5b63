class CreateBlog < ActiveRecord::Migration[6.1]
  def change
    create_table :authors do |t|
      t.string :name, null: false
      t.string :email, null: false
      t.timestamps
    end
    create_table :posts do |t|
      t.references :author, null: false, foreign_key: true
      t.string :title, null: false
      t.text :body, null: false
      t.datetime :published_at, null: false
      t.timestamps
    end
    add_index :posts, :published_at
    create_table :comments do |t|
      t.references :post, null: false, foreign_key: true
      t.string :author_name, null: false
      t.text :body, null: false
      t.timestamps
    end
  end
end
