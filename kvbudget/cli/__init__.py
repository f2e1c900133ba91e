"""The command line: `kvbudget` and one module per subcommand (`cmd_*`)."""
