"""One module per `cachescope` subcommand: NAME, HELP, add_arguments(parser), run(args)."""
