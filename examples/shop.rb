# A small "application" for trying rbscope: a few classes doing CPU work on
# two threads, forever. Run it with `ruby examples/shop.rb` and profile it.
module Shop
  class Catalog
    def initialize
      @items = (1..2_000).map { |i| { id: i, price: (i * 7919) % 1000 } }
    end

    def search(term)
      @items.select { |item| item[:price] % term == 0 }
    end
  end

  class Checkout
    def total(items)
      items.sum { |item| tax(item[:price]) }
    end

    def tax(price)
      (price * 1.2).round(2)
    end
  end

  def self.serve(catalog, checkout)
    loop do
      found = catalog.search(7)
      checkout.total(found)
    end
  end
end

class Reports
  def self.render
    loop { (1..5_000).map(&:to_s).join(",").length }
  end
end

catalog = Shop::Catalog.new
checkout = Shop::Checkout.new
Thread.new { Thread.current.name = "reports"; Reports.render }
Thread.current.name = "web"
$stdout.puts "shop running (pid #{Process.pid})"
$stdout.flush
Shop.serve(catalog, checkout)
