from ualinkd.cli.main import entry

entry()
