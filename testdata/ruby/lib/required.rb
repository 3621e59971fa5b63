class Loaded
  def self.boot
    checkpoint
  end
end
Loaded.boot
