# A file whose name is longer than a thread name: Ruby names an unnamed
# thread's native thread after the file and first line of its block
# ("connection_pool_reaper.rb:8"), which does not fit in the kernel's 15
# bytes (Ruby cuts it to "connection_poo*"). names.rb starts a thread here.
module ConnectionPoolReaper
  # start runs work in a new thread, unnamed.
  def self.start(&work)
    Thread.new { work.call }
  end
end
