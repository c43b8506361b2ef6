package meter

import (
	"strconv"

	"github.com/redline-dev/redline/internal/tokens"
)

// maxDigits is the longest count parsed as a number; longer is over tokens.MaxTokens (13
// digits), so it is clamped without being parsed, and no value can overflow the parse.
const maxDigits = 13

// cost is a cost header's or trailer's reading.
type cost struct {
	n       int64
	clamped bool
	ok      bool
}

func (c cost) usage() tokens.Usage { return tokens.Usage{Total: c.n, Clamped: c.clamped} }

// parseCost reads the values of a cost header or trailer. A value is a decimal integer, digits
// only, optional spaces or tabs around it (HTTP's OWS). Anything else is absent, not zero: an
// empty value, a sign ("-5", "+5"), a fraction, an exponent ("1e30"), a list ("3, 4"), a hex
// or any other byte. A value over tokens.MaxTokens is clamped to it (clamped set), never
// wrapped. When several values are valid (the field repeated), the largest counts: a response
// that names two costs is charged the larger. The work is one pass over bytes the transport
// already bounded (the response header block, or 4 KiB of trailers), with no allocation.
func parseCost(vals []string) cost {
	var best cost
	for _, v := range vals {
		c, ok := parseOne(v)
		if !ok {
			continue
		}
		if !best.ok || c.n > best.n {
			best = c
		}
	}
	return best
}

func parseOne(v string) (cost, bool) {
	i, j := 0, len(v)
	for i < j && (v[i] == ' ' || v[i] == '\t') {
		i++
	}
	for j > i && (v[j-1] == ' ' || v[j-1] == '\t') {
		j--
	}
	digits := v[i:j]
	if digits == "" {
		return cost{}, false
	}
	for k := 0; k < len(digits); k++ {
		if digits[k] < '0' || digits[k] > '9' {
			return cost{}, false
		}
	}
	for len(digits) > 1 && digits[0] == '0' {
		digits = digits[1:] // "007" is 7, however many zeros lead
	}
	if len(digits) > maxDigits {
		return cost{n: tokens.MaxTokens, clamped: true, ok: true}, true
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return cost{}, false // unreachable: at most 13 digits
	}
	if n > tokens.MaxTokens {
		return cost{n: tokens.MaxTokens, clamped: true, ok: true}, true
	}
	return cost{n: n, ok: true}, true
}
