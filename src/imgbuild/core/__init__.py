"""The ground floor every other package stands on: errors and their exit codes, paths, value checks, users' files
read where they belong and with a bound, progress output and interrupt handling. It imports nothing else of
imgbuild."""
