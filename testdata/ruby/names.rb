# names.rb: threads whose names and statuses profilers get wrong. Once
# every thread is where it stays, prints one JSON line per thread with
# Ruby's own view of it (its tid, Thread#name, Thread#status, the kernel's
# name of its native thread, and the file and line of its block as
# Thread#inspect gives them), then "ready", and stays there until killed.
#
# - "puma srv threadpool 001" and "puma srv threadpool 002": longer than
#   the kernel's 15 bytes, and alike in their first 20 characters
# - two threads named "worker", one sleeping, one joining another thread
# - an unnamed thread started in lib/connection_pool_reaper.rb, whose
#   native name Ruby cuts ("connection_poo*"), and an unnamed one started
#   here ("names.rb:LINE" fits)
# - statuses: sleep (Kernel#sleep, Thread#join, Queue#pop), run (a busy
#   loop), aborting (killed while it runs its ensure clause, busy)
#
# The main thread is reported by a last thread once it sleeps; that thread
# then ends.
require "json"
require_relative "lib/connection_pool_reaper"
$stdout.sync = true

def tid = File.readlink("/proc/thread-self").split("/").last.to_i

Tids = Queue.new
def note = Tids << [Thread.current, tid]

# spin runs a little, then lets the other threads have the GVL: the busy
# threads change their stacks all the time without starving the others
# (on 3.3 this script took 10 s to report without it).
def spin = (x = 0; 1000.times { x += 1 }; Thread.pass; x)

q = Queue.new
threads = []
threads << Thread.new { Thread.current.name = "puma srv threadpool 001"; note; q.pop }
threads << Thread.new { Thread.current.name = "puma srv threadpool 002"; note; q.pop }
sleeper = Thread.new { Thread.current.name = "worker"; note; sleep }
threads << sleeper
threads << Thread.new { Thread.current.name = "worker"; note; sleeper.join }
threads << Thread.new { Thread.current.name = "busy"; note; loop { spin } }
aborting = Thread.new do
  Thread.current.name = "aborting"
  note
  begin
    sleep
  ensure
    loop { spin }
  end
end
threads << aborting
threads << ConnectionPoolReaper.start { note; q.pop }
threads << Thread.new { note; q.pop }

sleep 0.01 until Tids.size == threads.size && threads.all? { |t| %w[sleep run].include?(t.status) }
sleep 0.01 until aborting.status == "sleep"
aborting.kill
sleep 0.01 until aborting.status == "aborting"

tids = {}
tids.store(*Tids.pop) until Tids.empty?
main = Thread.main
Thread.new do
  sleep 0.01 until main.status == "sleep"
  sleep 0.2
  ([[main, Process.pid]] + threads.map { |t| [t, tids.fetch(t)] }).each do |t, id|
    start = t.inspect[/ (\S+):(\d+) [a-z_]+>\z/] && "#{File.basename($1)}:#{$2}"
    puts JSON.generate({ "tid" => id, "name" => t.name, "status" => t.status, "main" => t == main,
                         "comm" => File.read("/proc/self/task/#{id}/comm").chomp, "start" => start })
  end
  puts "ready"
end
sleep
