package limiter_test

import (
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/limiter"
)

// fuzzEntry is one descriptor entry of FuzzKeyInjective.
type fuzzEntry struct {
	key, value string
	shared     bool // written with AddShared: value is a pattern
}

// fuzzDesc is everything a key is built from.
type fuzzDesc struct {
	domain    string
	entries   []fuzzEntry // 0 to 3
	algorithm config.Algorithm
	window    time.Duration // whole seconds, as every window of the service
}

func (d fuzzDesc) equal(o fuzzDesc) bool {
	if d.domain != o.domain || d.algorithm != o.algorithm || d.window != o.window || len(d.entries) != len(o.entries) {
		return false
	}
	for i := range d.entries {
		if d.entries[i] != o.entries[i] {
			return false
		}
	}
	return true
}

func (d fuzzDesc) key() string {
	var b limiter.KeyBuilder
	b.Reset(d.domain)
	for _, e := range d.entries {
		if e.shared {
			b.AddShared(e.key, e.value)
		} else {
			b.Add(e.key, e.value)
		}
	}
	return b.Key(d.algorithm, d.window)
}

var fuzzAlgorithms = []config.Algorithm{config.SlidingWindowLog, config.SlidingWindowCounter, config.FixedWindow}

// reader takes length-prefixed strings off the fuzzer's bytes: one byte n,
// then n%16 bytes (fewer at the end of the data). Any byte can appear in a
// string, separators included. With n's top bit set, those bytes are
// repeated to 56 + 2*(n>>4&7) bytes (56 to 70): around MaxKeyComponent,
// where a component is written as its digest.
type reader struct{ data []byte }

func (r *reader) byte() byte {
	if len(r.data) == 0 {
		return 0
	}
	b := r.data[0]
	r.data = r.data[1:]
	return b
}

func (r *reader) string() string {
	head := r.byte()
	n := min(int(head)%16, len(r.data))
	s := string(r.data[:n])
	r.data = r.data[n:]
	if head&0x80 != 0 && s != "" {
		long := 56 + 2*int(head>>4&7)
		s = strings.Repeat(s, long/len(s)+1)[:long]
	}
	return s
}

// entryCount maps a header byte to 0-3 entries (0, 1, 2 give 1, 2, 3).
func entryCount(head byte) int { return (1 + int(head&3)) % 4 }

// decodeDesc derives a descriptor from data, alg and window: the first byte
// gives the number of entries (0-3) and their shared flags, then come the
// domain and each entry's key and value.
func decodeDesc(data []byte, alg uint8, window uint32) fuzzDesc {
	r := &reader{data}
	head := r.byte()
	d := fuzzDesc{
		domain:    r.string(),
		entries:   make([]fuzzEntry, entryCount(head)),
		algorithm: fuzzAlgorithms[int(alg)%len(fuzzAlgorithms)],
		window:    time.Duration(1+window%(1<<31)) * time.Second,
	}
	for i := range d.entries {
		d.entries[i] = fuzzEntry{key: r.string(), value: r.string(), shared: head&(4<<i) != 0}
	}
	return d
}

// resplit returns a descriptor with a's domain, keys and values concatenated
// in order and cut again at other places (lengths from data), with the
// number of entries and shared flags from data too: the inputs a schema
// without escaping would confuse ("a|b" + "c" versus "a" + "|bc").
func resplit(a fuzzDesc, data []byte) fuzzDesc {
	var all strings.Builder
	all.WriteString(a.domain)
	for _, e := range a.entries {
		all.WriteString(e.key)
		all.WriteString(e.value)
	}
	rest := all.String()
	r := &reader{data}
	head := r.byte()
	take := func() string {
		n := min(int(r.byte())%16, len(rest))
		s := rest[:n]
		rest = rest[n:]
		return s
	}
	d := fuzzDesc{domain: take(), entries: make([]fuzzEntry, entryCount(head)), algorithm: a.algorithm, window: a.window}
	for i := range d.entries {
		d.entries[i] = fuzzEntry{key: take(), value: take(), shared: head&(4<<i) != 0}
	}
	// Nothing is lost: both have the same bytes in all.
	if n := len(d.entries); n > 0 {
		d.entries[n-1].value += rest
	} else {
		d.domain += rest
	}
	return d
}

// FuzzKeyInjective checks that two descriptors share a key exactly when they
// are equal (components longer than MaxKeyComponent are compared by their
// SHA-256, whose collisions are out of a fuzzer's reach), and that every key
// is rl:{IDENTITY}:ALG:SECONDS with exactly one hash tag, which holds the
// whole identity (it decodes back to the input, or to its digest).
func FuzzKeyInjective(f *testing.F) {
	f.Add(uint8(0), []byte("\x00\x03api\x04path\x06/login"), []byte("\x00\x03api\x04path\x06/login"), uint8(0), uint8(0), uint32(59), uint32(59))
	f.Add(uint8(1), []byte("\x05\x03api\x04path\x06/api/*\x04user\x05alice"), []byte{}, uint8(1), uint8(2), uint32(0), uint32(3599))
	f.Add(uint8(2), []byte("\x02\x01a\x03k|b\x01c\x01d\x01e"), []byte("\x02\x01\x01\x04\x01\x01\x01"), uint8(2), uint8(2), uint32(9), uint32(9))
	f.Add(uint8(0), []byte("\x00\x01a\x01=\x01*"), []byte("\x04\x01a\x01=\x00"), uint8(0), uint8(0), uint32(0), uint32(0))
	f.Add(uint8(0), []byte("\x00\x03a:b\x02{}\x03%2A"), []byte("\x00\x03a:b\x02{}\x01*"), uint8(1), uint8(1), uint32(1), uint32(1))
	f.Add(uint8(2), []byte("\x1e\x02\x00\xff\x01|\x01=\x01}\x01{\x01:\x01%"), []byte("\x1a\x00\x02\x02\x02\x02\x02\x02"),
		uint8(0), uint8(0), uint32(86399), uint32(0))
	f.Add(uint8(0), []byte("\x00\x03api\x01k\xf1a"), []byte("\x00\x03api\x01k\xf1b"), uint8(0), uint8(0), uint32(59), uint32(59))
	f.Add(uint8(2), []byte("\x00\x03api\xf2#Y\xf1\xff"), []byte("\x00\x0f\x0f\x0f"), uint8(1), uint8(1), uint32(1), uint32(1))
	f.Fuzz(func(t *testing.T, mode uint8, a, b []byte, algA, algB uint8, winA, winB uint32) {
		da := decodeDesc(a, algA, winA)
		var db fuzzDesc
		switch mode % 3 {
		case 0:
			db = decodeDesc(b, algB, winB)
		case 1:
			db = decodeDesc(a, algA, winA) // the same input, built again
		case 2:
			db = resplit(da, b)
		}
		ka, kb := da.key(), db.key()
		checkKeyForm(t, da, ka)
		checkKeyForm(t, db, kb)
		if eq := da.equal(db); eq != (ka == kb) {
			t.Fatalf("inputs equal %v but keys equal %v:\n%+v -> %q\n%+v -> %q", eq, ka == kb, da, ka, db, kb)
		}
	})
}

// checkKeyForm checks that key is rl:{TAG}:ALG:SECONDS, with one '{' and one
// '}', and that TAG decodes back to d's domain and entries.
func checkKeyForm(t *testing.T, d fuzzDesc, key string) {
	t.Helper()
	if strings.Count(key, "{") != 1 || strings.Count(key, "}") != 1 || !strings.HasPrefix(key, "rl:{") {
		t.Fatalf("key %q: want exactly one hash tag, right after rl:", key)
	}
	end := strings.IndexByte(key, '}')
	tag, suffix := key[len("rl:{"):end], key[end+1:]
	code := map[config.Algorithm]string{config.SlidingWindowLog: "log", config.SlidingWindowCounter: "counter", config.FixedWindow: "fixed"}[d.algorithm]
	if want := ":" + code + ":" + strconv.FormatInt(int64(d.window/time.Second), 10); suffix != want {
		t.Fatalf("key %q: suffix %q, want %q", key, suffix, want)
	}
	// The tag is empty only for an empty domain without entries ("rl:{}:…",
	// which Redis Cluster would not take as a hash tag); the service never
	// builds that key, as it refuses both an empty domain and a descriptor
	// without entries.
	if tag == "" && (d.domain != "" || len(d.entries) > 0) {
		t.Fatalf("key %q: empty hash tag", key)
	}
	parts := strings.Split(tag, "|")
	if len(parts) != 1+len(d.entries) {
		t.Fatalf("key %q: %d components in the tag, want %d", key, len(parts), 1+len(d.entries))
	}
	checkComponent(t, key, parts[0], d.domain)
	for i, p := range parts[1:] {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			t.Fatalf("key %q: entry %d has no '='", key, i)
		}
		want := d.entries[i]
		if shared := strings.HasPrefix(v, "*"); shared != want.shared {
			t.Fatalf("key %q: entry %d shared %v, want %v", key, i, shared, want.shared)
		}
		checkComponent(t, key, k, want.key)
		checkComponent(t, key, strings.TrimPrefix(v, "*"), want.value)
	}
}

// checkComponent checks that s, a component of key, is want: percent-encoded
// up to MaxKeyComponent bytes, else '#' and its base64url SHA-256.
func checkComponent(t *testing.T, key, s, want string) {
	t.Helper()
	if len(want) > limiter.MaxKeyComponent {
		sum := sha256.Sum256([]byte(want))
		if s != "#"+base64.RawURLEncoding.EncodeToString(sum[:]) {
			t.Fatalf("key %q: component %q, want the digest of the %d bytes %q", key, s, len(want), want)
		}
		return
	}
	if got := unescape(t, key, s); got != want {
		t.Fatalf("key %q: component %q decodes to %q, want %q", key, s, got, want)
	}
}

// unescape reverses the percent-encoding and checks that s holds only the
// unreserved bytes and %XX.
func unescape(t *testing.T, key, s string) string {
	t.Helper()
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', strings.IndexByte("-._~/", c) >= 0:
			b.WriteByte(c)
		case c == '%' && i+2 < len(s) && isUpperHex(s[i+1]) && isUpperHex(s[i+2]):
			n, _ := strconv.ParseUint(s[i+1:i+3], 16, 8)
			b.WriteByte(byte(n))
			i += 2
		default:
			t.Fatalf("key %q: byte %q at %d of component %q is neither unreserved nor %%XX", key, c, i, s)
		}
	}
	return b.String()
}

func isUpperHex(c byte) bool { return '0' <= c && c <= '9' || 'A' <= c && c <= 'F' }
