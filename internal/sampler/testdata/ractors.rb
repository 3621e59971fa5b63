# ractors.rb: two ractors, each spinning in its own method: each ractor has
# a GVL of its own, so both threads run Ruby at once, and stopping one
# GVL's holder does not freeze the other.
$stdout.sync = true
$stderr.reopen(File::NULL) # "Ractor is experimental"
def ractor_spin
  x = 0
  loop { x += 1 }
end
def main_spin
  x = 0
  loop { x += 1 }
end
Ractor.new { ractor_spin }
sleep 0.1
puts "ready"
main_spin
