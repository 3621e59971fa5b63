# natives.rb: 100 native threads that never run Ruby (started with
# pthread_create on libc's pause(), as a C library's thread pool would),
# and two Ruby threads, one busy and one sleeping.
require "fiddle"
$stdout.sync = true
libc = Fiddle.dlopen(nil)
create = Fiddle::Function.new(libc["pthread_create"], [Fiddle::TYPE_VOIDP] * 4, Fiddle::TYPE_INT)
100.times do
  rc = create.call(Fiddle::Pointer.malloc(8), nil, libc["pause"], nil)
  raise "pthread_create: #{rc}" unless rc.zero?
end
def busy_worker
  x = 0
  loop { x += 1 }
end
def idle_waiter
  sleep
end
Thread.new { busy_worker }.name = "busy"
Thread.new { idle_waiter }.name = "idle"
sleep 0.1
puts "ready"
sleep
