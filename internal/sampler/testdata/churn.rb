# churn.rb THREADS: each thread keeps defining a class in its own file
# (gen_T_I.rb, from BODY below), calls through it, drops it, and runs
# GC.start every 100 classes, so that the VM frees and reuses the memory of
# iseqs, method entries, classes and strings all the time. The file of class
# T_I holds only methods named *_T_I, so a frame that names a method, file,
# class or line of another class (or of another thread T) was not on that
# thread's stack. Prints "ready" once every thread has defined a class.
$stdout.sync = true

# Line numbers matter: gen_churn_test.go checks them.
BODY = <<~'RUBY'
  def outer_%{id}(n)
    inner_%{id}(n) + 1
  end
  def inner_%{id}(n)
    x = 0
    n.times { |k| x += k }
    x
  end
  define_method(:dm_%{id}) do |n|
    outer_%{id}(n)
  end
  def self.cm_%{id}(n)
    new.dm_%{id}(n)
  end
RUBY

def churn(t, started)
  i = 0
  loop do
    i += 1
    id = "#{t}_#{i}"
    k = Class.new
    Object.const_set("Gen_#{id}", k)
    k.class_eval(format(BODY, id: id), "gen_#{id}.rb", 1)
    k.public_send("cm_#{id}", 3000)
    Object.send(:remove_const, "Gen_#{id}")
    started.push(t) if i == 1
    GC.start if i % 100 == 0
  end
end

n = Integer(ARGV[0] || 2)
started = Queue.new
threads = (1..n).map do |t|
  th = Thread.new { churn(t, started) }
  th.name = "churn-#{t}"
  th
end
n.times { started.pop }
puts "ready"
threads.each(&:join)
