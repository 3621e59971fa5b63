# Nested modules/classes, blocks, C frames, a singleton method.
module Outer
  class Inner
    def level3
      loop do
        $stdout.flush
      end
    end

    def level2
      [1].each { |_| level3 }
    end
  end

  def self.helper
    3.times { Inner.new.level2 }
  end
end

class Foo
  def self.start
    Outer.helper
  end
end

$stdout.puts "ready"
$stdout.flush
Foo.start
