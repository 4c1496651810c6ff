package limiter

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// KeyBuilder builds store keys:
//
//	rl:{<domain>|<key>=<value>|<key>=*<pattern>...}:<algorithm>:<window seconds>
//
// (a calendar's fixed window names its calendar in place of the seconds,
// CalendarKey), each component percent-encoded, or hashed when longer than
// MaxKeyComponent, so that no two identities share a key and none holds a
// separator; the braces are a Redis Cluster hash tag around the identity.
// Prefix, when set, comes first, outside the tag (the reference's
// CACHE_KEY_PREFIX). After ResetReference it writes envoyproxy/ratelimit's
// keys byte for byte instead (reference_fixed_window), so that its replicas
// and this service count together: <prefix><domain>_<key>_<value>_..._<window
// start>, unescaped, untagged. docs/stores.md ("Key schema") says both in
// full, with what each algorithm keeps at its key.
//
// The zero value is ready to use; reusing a builder reuses its buffer.
type KeyBuilder struct {
	Prefix string
	// Now is the instant whose window the reference's keys name: one clock
	// reading per request, as the reference reads its clock.
	Now       time.Time
	buf       []byte
	reference bool // started with ResetReference
}

// Reset starts a key for domain.
func (b *KeyBuilder) Reset(domain string) {
	b.reference = false
	b.buf = append(append(b.buf[:0], b.Prefix...), "rl:{"...)
	b.buf = appendEscaped(b.buf, domain)
}

// ResetReference starts a key for domain in envoyproxy/ratelimit's schema.
func (b *KeyBuilder) ResetReference(domain string) {
	b.reference = true
	b.buf = append(append(append(b.buf[:0], b.Prefix...), domain...), '_')
}

// Add appends a descriptor entry.
func (b *KeyBuilder) Add(key, value string) {
	if b.reference {
		b.buf = append(append(append(append(b.buf, key...), '_'), value...), '_')
		return
	}
	b.buf = append(b.buf, '|')
	b.buf = appendEscaped(b.buf, key)
	b.buf = append(b.buf, '=')
	b.buf = appendEscaped(b.buf, value)
}

// AddShared appends an entry whose values share one counter per pattern.
func (b *KeyBuilder) AddShared(key, pattern string) {
	if b.reference {
		b.Add(key, pattern)
		return
	}
	b.buf = append(b.buf, '|')
	b.buf = appendEscaped(b.buf, key)
	b.buf = append(b.buf, '=', '*')
	b.buf = appendEscaped(b.buf, pattern)
}

// Key finishes the key with the algorithm and the window and returns it; a
// key in the reference's schema ends with the start of Now's window instead.
func (b *KeyBuilder) Key(a config.Algorithm, window time.Duration) string {
	if b.reference {
		unit := max(int64(window/time.Second), 1)
		b.buf = strconv.AppendInt(b.buf, b.Now.Unix()/unit*unit, 10)
		return string(b.buf)
	}
	b.buf = append(b.buf, '}', ':')
	b.buf = append(b.buf, algorithmCode(a)...)
	b.buf = append(b.buf, ':')
	b.buf = strconv.AppendInt(b.buf, int64(window/time.Second), 10)
	return string(b.buf)
}

// CalendarKey finishes the key of a fixed window aligned to the calendar
// c: its algorithm, then c's name instead of a length, its zone escaped
// ("fixed:1mo", "fixed:7d@Europe/Berlin"), so that a counter of calendar
// windows, whose value names its window by its start, is never read as
// one of epoch-aligned windows, nor of another zone's. The reference's
// keys have no calendar (config.CalendarOf): never start one with
// ResetReference.
func (b *KeyBuilder) CalendarKey(a config.Algorithm, c config.Calendar) string {
	b.buf = append(b.buf, '}', ':')
	b.buf = append(b.buf, algorithmCode(a)...)
	b.buf = append(b.buf, ':')
	if c.Months > 0 {
		b.buf = append(strconv.AppendInt(b.buf, int64(c.Months), 10), "mo"...)
	} else {
		b.buf = append(strconv.AppendInt(b.buf, int64(c.Days), 10), 'd')
	}
	if c.Zone != nil {
		b.buf = appendEscaped(append(b.buf, '@'), c.Zone.String())
	}
	return string(b.buf)
}

// algorithmCode is a's code in keys. An algorithm the Lua does not
// implement gets its String, which no algorithm's code is: Decide and Reset
// refuse its hits.
func algorithmCode(a config.Algorithm) string {
	d, err := describe(a)
	if err != nil {
		return a.String()
	}
	return d.Key
}

// MaxKeyComponent is the longest domain, key, value or pattern written into
// a store key as it is (percent-encoded); a longer one is written as its
// digest.
const MaxKeyComponent = 64

const hexDigits = "0123456789ABCDEF"

// appendEscaped appends one component: percent-encoded up to
// MaxKeyComponent bytes, else '#' and its digest.
func appendEscaped(dst []byte, s string) []byte {
	if len(s) > MaxKeyComponent {
		sum := sha256.Sum256([]byte(s))
		dst = append(dst, '#')
		return base64.RawURLEncoding.AppendEncode(dst, sum[:])
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if unreserved(c) {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '%', hexDigits[c>>4], hexDigits[c&0xF])
	}
	return dst
}

func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~' || c == '/'
}

// sliceRecordKey is where the counter or GCRA bucket at key records the
// slices leased from it (scripts/lua's decide record_slice, refund and
// reset): key and ":slices", in key's hash slot (the hash tag is key's).
func sliceRecordKey(key string) string { return key + ":slices" }

// recordsSlices reports an algorithm whose counters record the slices
// leased from them at sliceRecordKey: not the log, which names its members
// instead, nor the reference's keys, which have no hash tag (and no slices).
func recordsSlices(a config.Algorithm) bool {
	return a != config.SlidingWindowLog && !a.ReferenceKeys()
}

// recordsSlice reports a hit whose call touches the records of its key's
// slices: a lease of a hot key's slice (Hit.Ahead) of an algorithm that
// records them, or a refund, which leaves what they hold.
func recordsSlice(h *Hit) bool {
	return recordsSlices(h.Algorithm) && (h.Ahead > 0 || h.Refund)
}
