"""What a person sees while a command runs, above the pipeline: only the command line (imgbuild.cli) imports it.

The floors below report through small interfaces of their own (`build.builders.BuildObserver` for a build,
`publish.PushObserver` for a push) and never import rich's displays; `progress` implements both, live on a
terminal, one line per event in a CI log.
"""
