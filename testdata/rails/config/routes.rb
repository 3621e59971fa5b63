Rails.application.routes.draw do
  get "/posts", to: "posts#index", defaults: { format: :json } # JSON over sqlite with includes
  get "/page", to: "posts#page"                                # an ERB page with partials
end
