require "mkmf"
create_makefile("gcclock")
