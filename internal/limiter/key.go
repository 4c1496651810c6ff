package limiter

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// KeyBuilder builds store keys. The schema is
//
//	rl:{<domain>|<key>=<value>|<key>=*<pattern>...}:<algorithm>:<window seconds>
//
// or, for a fixed window aligned to the calendar, its calendar in place of
// the window's length (CalendarKey),
// with <algorithm> its key code (the Key of internal/algorithm's
// Descriptor: log, counter, fixed, gcra), one `|<key>=<value>` per
// descriptor entry in request order, and `|<key>=*<pattern>` for an entry
// matched by a share_threshold wildcard (all its values share one counter). Each component (domain, key, value,
// pattern) is written one of two ways:
//
//   - up to MaxKeyComponent bytes: percent-encoded, every byte outside
//     [A-Za-z0-9-._~/] becoming %XX;
//   - longer: '#' and the unpadded base64url SHA-256 of its bytes (44 bytes
//     in all), so that a client's 100 KiB header value makes a short key.
//
// Percent-encoding writes '#' as %23, so the two forms never meet, and
// neither holds a separator | = * { } :. Hence no two distinct (domain,
// entries, algorithm, window) share a key, whatever bytes the values hold
// (valid UTF-8 or not), except two long components with one SHA-256: a
// collision nobody knows how to find. A key is at most about 200 bytes per
// component. The braces are a Redis Cluster hash tag around the whole
// identity, and every algorithm keeps its whole state at the key itself,
// but for the records of a counter's or GCRA's slices (sliceRecordKey).
//
// Prefix, when set, comes before the whole key, outside the hash tag: it
// separates the counters of services sharing one Redis (the reference's
// CACHE_KEY_PREFIX), and never changes which slot a key hashes to.
//
// The algorithms with ReferenceKeys in internal/algorithm's table
// (reference_fixed_window) are keyed instead as envoyproxy/ratelimit keys
// its counters, byte for byte, so that its replicas and this service count
// together (started with ResetReference):
//
//	<prefix><domain>_<key>_<value>_..._<window start>
//
// one `<key>_<value>_` per descriptor entry, `<key>_<pattern>_` for an entry
// matched by a share_threshold wildcard (the configured value, its '*'
// included), and the start of the window that holds Now, in Unix seconds:
// Now's seconds rounded down to a multiple of the window's. Nothing is
// escaped or hashed and there is no hash tag, as in the reference: distinct
// descriptors can share a key there too ("a_b" and "a", "b_c"), a key is as
// long as its values, and the keys of one request land on as many Redis
// Cluster slots as they hash to (the limiter decides a request's slots all
// or nothing). A new window is a new key.
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
// records them, or a GCRA refund, which leaves what they hold.
func recordsSlice(h *Hit) bool {
	return recordsSlices(h.Algorithm) && (h.Ahead > 0 || h.Refund && h.Algorithm.Bucket())
}
