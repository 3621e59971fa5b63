# A target shaped like puma serving a Rails app (issue 33): 12 Ruby
# threads. 5 "puma srv tp 00N" threads are busy 150 frames deep (counting
# the C functions JSON.generate calls and String#gsub!), generating JSON
# and rewriting it, and share the GVL; 7 are idle as puma's are: the main
# thread in Thread#join, a reactor and a server thread in IO.select, a
# reaper, a trimmer and a connection-pool reaper in sleep, and a worker in
# Queue#pop. Prints the busy threads' depth ("depth=N", Ruby's own count
# from caller_locations), then "ready", and runs until killed.
require "json"

DEPTH = 150
POSTS = Array.new(30) do |i|
  { id: i, title: "Post #{i} about ruby", body: "ruby " * 40,
    comments: Array.new(10) { |j| { id: j, author: "reader #{j}", body: "ruby profiler " * 3 } } }
end

def deep(n, &blk) = n > 0 ? deep(n - 1, &blk) : blk.call

def serve(depths)
  first = true
  loop do
    # JSON.generate (Ruby) calls State#generate (C): two frames inwards
    # of this block; String#gsub! is one.
    (depths << caller_locations(0).size + 2; first = false) if first
    s = JSON.generate(POSTS)
    s.gsub!("ruby", "Ruby")
  end
end

depths = Queue.new
r, w = IO.pipe
jobs = Queue.new
# Frames under serve's loop block: the block, Kernel#loop, serve, deep's
# block, deep (n + 1 times) and the thread's block: n + 6. Plus 2 inwards.
busy = 5.times.map do |i|
  Thread.new { deep(DEPTH - 8) { serve(depths) } }.tap { |t| t.name = format("puma srv tp %03d", i + 1) }
end
Thread.new { loop { IO.select([r], nil, nil, 5) } }.name = "puma reactor"
Thread.new { loop { IO.select([r], nil, nil, 1) } }.name = "puma srv"
Thread.new { loop { sleep 1 } }.name = "puma srv threadpool reaper"
Thread.new { loop { sleep 30 } }.name = "puma srv threadpool trimmer"
Thread.new { loop { sleep 60 } }.name = "connection_pool reaper"
Thread.new { loop { jobs.pop } }.name = "worker"
Thread.current.name = "puma"
got = Array.new(busy.size) { depths.pop }
puts "depth=#{got.uniq.join(",")}"
puts "ready"
$stdout.flush
busy.first.join
