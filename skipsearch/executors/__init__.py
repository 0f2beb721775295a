"""Where masks are evaluated: the Executor interface and LocalExecutor (`base`), Ray actors (`ray`)."""
