"""The ground floor every other package stands on: errors and their exit codes, paths, value checks, users' files
read where they belong and with a bound, text fit for a log line and interrupt handling; and what recipes and blocks
are written in that belongs to no component: field types (fields), CPU architectures and their names (platforms),
what each distribution release ships (distro), version equality (versions) and the AWS instance families
(instances). It imports nothing else of imgbuild."""
