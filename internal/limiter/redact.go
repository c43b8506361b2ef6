package limiter

// RedactURL returns a Redis URL fit for logs: any credentials are replaced by ***.
func RedactURL(raw string) string { return redact(raw) }
