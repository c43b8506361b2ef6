package limiter

// stateKey is the Redis key of an algorithm's state for a key built by keyscheme.Key.
func stateKey(key string, a Algorithm) string {
	return key + ":" + a.suffix()
}
