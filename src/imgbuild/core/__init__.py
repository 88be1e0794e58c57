"""The ground floor every other package stands on: errors and their exit codes, paths, value checks, users' files
read where they belong and with a bound, text fit for a log line and interrupt handling. It imports nothing else of
imgbuild."""
