"""What every fab task shares: the executor that runs a task on the inventory's hosts and turns its
errors into exit codes (executor), the options' declarations and parsers (options), tandem's version."""
