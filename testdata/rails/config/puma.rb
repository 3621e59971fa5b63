# Puma as the rails-app fixture runs it: production, 5 threads, on the
# loopback only; PORT=0 (the default) lets the kernel pick a free port,
# which puma prints ("Listening on http://127.0.0.1:PORT").
threads 5, 5
bind "tcp://127.0.0.1:#{ENV.fetch("PORT", "0")}"
environment ENV.fetch("RAILS_ENV", "production")
