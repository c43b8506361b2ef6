// Package keyscheme names the Redis keys of Redline's limits: one layout, shared by the sidecar
// that counts under them, the limiter that appends its algorithm's suffix, the heartbeats of
// package fleet and the Redis users of package redisacl, which may touch a namespace's keys
// only. It imports nothing of the engine, so that knowing where a namespace's keys live does
// not mean linking the limiter.
//
// User material enters a key only as a fixed-length hash, inside a Redis Cluster hash tag.
package keyscheme

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"
)

// keyHashBytes is how much of the SHA-256 of the key material goes into a key: 128 bits keep
// accidental collisions out of reach for any realistic number of clients.
const keyHashBytes = 16

// Key returns the Redis key prefix of one limited key:
//
//	rl:{<namespace>/<policy>/<rule>/<hash>}
//
// The braces are a Redis Cluster hash tag, so every key of one limit lives in one slot. parts is
// the user-supplied key material (header values, addresses, ...); it enters the key only as a
// fixed-length hash, so no client can choose key bytes, make keys long, or break out of the tag.
// Namespace, policy and rule are escaped so that '{', '}', '/' and non-printable bytes cannot
// appear raw. The limiter appends its algorithm's suffix (":swc", ":tb", ...) when it calls Redis.
func Key(namespace, policy, rule string, parts ...string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, p := range parts {
		// Length-prefix every part so ("ab","c") and ("a","bc") hash differently.
		_, _ = h.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		_, _ = h.Write([]byte(p))
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])

	var b strings.Builder
	b.Grow(len("rl:{///}") + len(namespace) + len(policy) + len(rule) + 2*keyHashBytes)
	b.WriteString("rl:{")
	writeEscaped(&b, namespace)
	b.WriteByte('/')
	writeEscaped(&b, policy)
	b.WriteByte('/')
	writeEscaped(&b, rule)
	b.WriteByte('/')
	var hx [2 * keyHashBytes]byte
	hex.Encode(hx[:], sum[:keyHashBytes])
	b.Write(hx[:])
	b.WriteByte('}')
	return b.String()
}

// Hash returns the hash part of a key built by Key: 32 hex digits, which name the key in
// what a sidecar reports of its top keys (the readable parts stay in the sidecar unless a
// policy lets them out). It is "" for a string Key did not build.
func Hash(key string) string {
	const n = 2 * keyHashBytes
	if len(key) < n+2 || key[len(key)-1] != '}' || key[len(key)-n-2] != '/' {
		return ""
	}
	return key[len(key)-n-1 : len(key)-1]
}

// Part returns s as Key writes a namespace, policy or rule: every byte outside
// [A-Za-z0-9._-] as %XX, so Kubernetes names pass unchanged and no name can break out of a hash
// tag. Other keys under rl:...{ (the heartbeats of package fleet) name their parts with it too.
func Part(s string) string {
	var b strings.Builder
	writeEscaped(&b, s)
	return b.String()
}

// writeEscaped writes s as Part returns it.
func writeEscaped(b *strings.Builder, s string) {
	const hexDigits = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&0xF])
	}
}

// Prefix is how every key Key builds for namespace starts: rl:{<namespace>/. A namespace's
// Redis user may touch the keys under it (see package redisacl).
func Prefix(namespace string) string { return "rl:{" + Part(namespace) + "/" }
