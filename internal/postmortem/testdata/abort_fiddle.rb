# abort(3) called through Fiddle from a method of a class, in a thread.
require 'fiddle'

class Crasher
  def abort_here
    Fiddle::Function.new(Fiddle.dlopen(nil)['abort'], [], Fiddle::TYPE_VOID).call
  end
end

t = Thread.new do
  Thread.current.name = "aborter"
  Crasher.new.abort_here
end
t.join
