# A thread sends SIGSEGV to the process from inside a known method. Ruby's
# own SEGV handler prints its crash report and aborts (SIGABRT).
def crash_here
  Process.kill(:SEGV, Process.pid)
  sleep 5
end

t = Thread.new do
  Thread.current.name = "crasher"
  crash_here
end
t.join
