# holdgvl.rb: one thread that alternates between sleeping in the kernel
# while holding the GVL (libc's usleep called through Fiddle with
# need_gvl: true, as a C extension that never releases the lock would)
# and spinning in pure Ruby (no C frame ever innermost). ARGV[0] "spin"
# leaves out the sleeps.
require "fiddle"
$stdout.sync = true
USLEEP = Fiddle::Function.new(Fiddle.dlopen(nil)["usleep"], [Fiddle::TYPE_INT], Fiddle::TYPE_INT, need_gvl: true)
def asleep_holding_gvl
  USLEEP.call(20_000)
end
def spin_in_ruby
  i = 0
  while i < 3_000_000
    i += 1
  end
end
sleepy = ARGV[0] != "spin"
Thread.current.name = "holder"
puts "ready"
while true
  asleep_holding_gvl if sleepy
  spin_in_ruby
end
