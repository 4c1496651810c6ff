package config_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf16"

	"gopkg.in/yaml.v3"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// fuzzName is the file name every fuzzed config is parsed under.
const fuzzName = "fuzz.yaml"

// FuzzParse feeds arbitrary bytes to Parse as a config file. Parse must never
// panic; what it accepts must satisfy every invariant the rest of the service
// relies on; what it refuses must be reported as "FILE:LINE: message" or, for
// the yaml.v3 errors that carry no position, "FILE: message".
func FuzzParse(f *testing.F) {
	for _, dir := range []string{"valid", "invalid", "dupdomain"} {
		files, err := filepath.Glob(filepath.Join("testdata", dir, "*.yaml"))
		if err != nil {
			f.Fatal(err)
		}
		if len(files) == 0 {
			f.Fatalf("no seed files in testdata/%s", dir)
		}
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := config.Parse(fuzzName, data, config.Defaults{})
		if err != nil {
			if c != nil {
				t.Fatalf("Parse returned both a config and the error %q", err)
			}
			checkParseError(t, data, err.Error())
			return
		}
		if c == nil {
			t.Fatal("Parse returned neither a config nor an error")
		}
		if files := c.Files(); !slices.Equal(files, []string{fuzzName}) {
			t.Fatalf("Files() = %q, want [%q]", files, fuzzName)
		}
		maxLine := lineCount(data)
		for _, r := range c.Rules() {
			checkRule(t, c, r, maxLine)
		}
		// Parsing is deterministic.
		again, err := config.Parse(fuzzName, data, config.Defaults{})
		if err != nil {
			t.Fatalf("second Parse failed: %v", err)
		}
		if a, b := ruleStrings(c), ruleStrings(again); !slices.Equal(a, b) {
			t.Fatalf("two Parse of one input differ:\n%q\n%q", a, b)
		}
	})
}

var (
	// errorWithLine is what every error of our own validation looks like,
	// and most of yaml.v3's once rewritten.
	errorWithLine = regexp.MustCompile(`^` + regexp.QuoteMeta(fuzzName) + `:([0-9]+): [^ ]`)
	// sourceForm is Rule.Source.
	sourceForm = regexp.MustCompile(`^` + regexp.QuoteMeta(fuzzName) + `:([0-9]+)$`)
)

// checkParseError asserts what the implementation guarantees of an error:
// it starts with the file name; it names a line within the input, except
// when it is one of yaml.v3's own errors passed on as "FILE: message".
// yaml.v3 gives no line for reader errors (invalid UTF-8, control
// characters), alias and merge key errors, and scanner and parser errors on
// the first line (its marks count from 0 and it only prints a line when the
// mark is not 0).
func checkParseError(t *testing.T, data []byte, msg string) {
	t.Helper()
	if !strings.HasPrefix(msg, fuzzName+":") {
		t.Fatalf("error %q does not start with %q", msg, fuzzName+":")
	}
	if m := errorWithLine.FindStringSubmatch(msg); m != nil {
		line, err := strconv.Atoi(m[1])
		if err != nil || line < 1 || line > lineCount(data) {
			t.Fatalf("error %q: line %s outside the input's %d lines", msg, m[1], lineCount(data))
		}
		return
	}
	rest := strings.TrimPrefix(msg, fuzzName+": ")
	if yerr := yamlReadError(data); yerr != nil && rest == strings.TrimPrefix(yerr.Error(), "yaml: ") {
		return // a syntax, encoding or alias error, passed on
	}
	for _, re := range decoderFailures {
		if re.MatchString(rest) {
			return // raised while decoding into Go values, without a position
		}
	}
	t.Fatalf("error %q has no line and is not one of yaml.v3's own errors (reading the input: %v)", msg, yamlReadError(data))
}

// decoderFailures are yaml.v3's errors raised while decoding nodes into Go
// values (its decode.go and resolve.go call failf without a position).
var decoderFailures = func() []*regexp.Regexp {
	var res []*regexp.Regexp
	for _, s := range []string{
		`map merge requires map or sequence of maps as the value`,
		`document contains excessive aliasing`,
		`anchor '.*' value contains itself`,
		`unknown anchor '.*' referenced`,
		`invalid map key: .*`,
		`!!binary value contains invalid base64 data`,
		`cannot decode .* as a .*`,
		`invalid array: want [0-9]+ elements but got [0-9]+`,
	} {
		res = append(res, regexp.MustCompile(`(?s)^`+s+`$`))
	}
	return res
}()

// yamlReadError returns yaml.v3's error on reading data as YAML nodes,
// document by document, as Parse does first, or nil.
func yamlReadError(data []byte) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// lineCount bounds the line numbers an error may name: YAML breaks lines at
// \n, \r, \r\n, NEL, LS and PS, in UTF-8 or, after a byte order mark, in
// UTF-16 (which yaml.v3 reads too); a scanner error at the end of the input
// may name the line after the last break.
func lineCount(data []byte) int {
	runes := []rune(string(data))
	if le, be := bytes.HasPrefix(data, []byte{0xff, 0xfe}), bytes.HasPrefix(data, []byte{0xfe, 0xff}); le || be {
		units := make([]uint16, 0, len(data)/2)
		for i := 0; i+1 < len(data); i += 2 {
			if le {
				units = append(units, uint16(data[i])|uint16(data[i+1])<<8)
			} else {
				units = append(units, uint16(data[i])<<8|uint16(data[i+1]))
			}
		}
		runes = utf16.Decode(units)
	}
	n := 1
	for i, r := range runes {
		switch r {
		case '\n', '\u0085', '\u2028', '\u2029':
			n++
		case '\r':
			if i+1 >= len(runes) || runes[i+1] != '\n' {
				n++
			}
		}
	}
	return n + 1
}

func checkRule(t *testing.T, c *config.Config, r *config.Rule, maxLine int) {
	t.Helper()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf("rule %q (%s): "+format, append([]any{r.String(), r.Source}, args...)...)
	}
	if r.Domain == "" {
		fail("empty domain")
	}
	if !c.HasDomain(r.Domain) {
		fail("HasDomain(%q) is false", r.Domain)
	}
	if len(r.Levels) == 0 {
		fail("no levels")
	}
	for i, l := range r.Levels {
		if l.Key == "" {
			fail("level %d has an empty key", i)
		}
		if l.Wildcard != strings.Contains(l.Value, "*") {
			fail("level %d: Wildcard %v for value %q", i, l.Wildcard, l.Value)
		}
		if l.ShareThreshold && !l.Wildcard {
			fail("level %d: share_threshold on a value without '*'", i)
		}
	}
	if m := sourceForm.FindStringSubmatch(r.Source); m == nil {
		fail("Source %q is not %s:LINE", r.Source, fuzzName)
	} else if line, _ := strconv.Atoi(m[1]); line < 1 || line > maxLine {
		fail("Source line %d outside the input", line)
	}
	if a := r.Algorithm.String(); a != "sliding_window_log" && a != "sliding_window_counter" && a != "fixed_window" && a != "gcra" {
		fail("unknown algorithm %v", r.Algorithm)
	}
	// Only a limited gcra rule has a bucket, never longer than MaxWindow to refill.
	if gcra := r.Algorithm == config.GCRA && !r.Unlimited; gcra != (r.Burst > 0) {
		fail("burst %d with algorithm %v", r.Burst, r.Algorithm)
	} else if gcra && float64(r.Burst)*float64(r.Window())/float64(r.RequestsPerUnit) > float64(config.MaxWindow) {
		fail("burst %d refills in more than %v", r.Burst, config.MaxWindow)
	}
	if fm := r.FailureMode.String(); fm != "allow" && fm != "deny" && fm != "defer" {
		fail("unknown failure mode %v", r.FailureMode)
	}
	if r.UnitMultiplier < 1 {
		fail("unit_multiplier %d", r.UnitMultiplier)
	}
	for _, name := range r.Replaces {
		if name == "" || name == r.Name {
			fail("replaces %q", r.Replaces)
		}
	}
	if r.Metadata != nil && len(r.Metadata.Fields) == 0 {
		fail("empty metadata is not nil")
	}
	if r.Unlimited {
		if r.Unit != 0 || r.RequestsPerUnit != 0 || r.UnitMultiplier != 1 || r.Window() != 0 {
			fail("unlimited with unit %v, requests %d, multiplier %d, window %v",
				r.Unit, r.RequestsPerUnit, r.UnitMultiplier, r.Window())
		}
	} else {
		if _, err := config.ParseUnit(r.Unit.String()); err != nil || r.Unit.Duration() <= 0 {
			fail("unknown unit %v", r.Unit)
		}
		w := r.Window()
		if w <= 0 || w/r.Unit.Duration() != time.Duration(r.UnitMultiplier) || w%r.Unit.Duration() != 0 {
			fail("window %v for %d x %v (overflow?)", w, r.UnitMultiplier, r.Unit)
		}
	}
	// A rule reached by exact values only is what Match returns for them:
	// an exact node always wins, and (key, value) is unique at each level.
	exact := true
	entries := make([]fuzzEntry, 0, len(r.Levels))
	for _, l := range r.Levels {
		if l.Value == "" || l.Wildcard {
			exact = false
			break
		}
		entries = append(entries, fuzzEntry{l.Key, l.Value})
	}
	if exact {
		if got := config.Match(c, r.Domain, entries); got != r {
			fail("Match on its own exact path returned %v", got)
		}
	}
}

func ruleStrings(c *config.Config) []string {
	var s []string
	for _, r := range c.Rules() {
		s = append(s, r.String()+" @"+r.Source)
	}
	return s
}

type fuzzEntry struct{ key, value string }

func (e fuzzEntry) GetKey() string   { return e.key }
func (e fuzzEntry) GetValue() string { return e.value }

// mnode is a descriptor of the FuzzMatch config, kept in Go so the reference
// matcher walks the tree as written rather than Load's index.
type mnode struct {
	key, value string // value "" is a key-only node; with '*' a wildcard
	limit      bool
	children   []*mnode
}

func mn(key, value string, limit bool, children ...*mnode) *mnode {
	return &mnode{key: key, value: value, limit: limit, children: children}
}

// matchTree has exact, wildcard (one, several and consecutive '*'), key-only
// and nested nodes, wildcards that overlap (file order decides), nodes with
// children but no limit, and a node with neither.
var matchTree = []*mnode{
	mn("path", "/api/v1/users", true),
	mn("path", "/api/*", true),
	mn("path", "*/users", true),
	mn("path", "/a*b*c*", true),
	mn("path", "**x**", true),
	mn("path", "", true,
		mn("user", "", true),
		mn("user", "adm*n", false,
			mn("action", "delete", true))),
	mn("file", "*.tar.*", true),
	mn("file", "*.tar.gz", true),
	mn("file", "a*b*c", true),
	mn("file", "ab*ba", true),
	mn("file", "*", false,
		mn("mode", "r*", true)),
	mn("tenant", "acme", false,
		mn("user", "", true),
		mn("user", "root", false,
			mn("action", "delete", true),
			mn("action", "*", true)),
		mn("user", "*bot", true)),
	mn("tenant", "ac*", true,
		mn("user", "", true)),
	mn("tenant", "", false,
		mn("plan", "free", true),
		mn("plan", "", false,
			mn("region", "eu-*", false,
				mn("zone", "", true)),
			mn("region", "*", true))),
	mn("host", "*", true),
	mn("leaf", "", false),
}

const matchDomain = "fz"

// matchYAMLOf renders the tree as a config file. Keys and values are
// printable ASCII, where Go's and YAML's double-quoted strings agree.
func matchYAMLOf(tree []*mnode) string {
	var b strings.Builder
	b.WriteString("domain: " + matchDomain + "\ndescriptors:\n")
	var write func(nodes []*mnode, indent string)
	write = func(nodes []*mnode, indent string) {
		for _, n := range nodes {
			b.WriteString(indent + "- key: " + strconv.Quote(n.key) + "\n")
			if n.value != "" {
				b.WriteString(indent + "  value: " + strconv.Quote(n.value) + "\n")
			}
			if n.limit {
				b.WriteString(indent + "  rate_limit: {unit: second, requests_per_unit: 1}\n")
			}
			if len(n.children) > 0 {
				b.WriteString(indent + "  descriptors:\n")
				write(n.children, indent+"    ")
			}
		}
	}
	write(tree, "  ")
	return b.String()
}

// refMatch is the reference: walk one level per entry, preferring the exact
// node, then the first wildcard in file order whose pattern matches, then the
// key-only node; the limit is the last entry's node's. It returns the path of
// nodes, or nil when no limit applies.
func refMatch(tree []*mnode, entries []fuzzEntry) []*mnode {
	var path []*mnode
	level := tree
	for _, e := range entries {
		n := refLookup(level, e.key, e.value)
		if n == nil {
			return nil
		}
		path = append(path, n)
		level = n.children
	}
	if len(path) == 0 || !path[len(path)-1].limit {
		return nil
	}
	return path
}

func refLookup(level []*mnode, key, value string) *mnode {
	for _, n := range level {
		if n.key == key && n.value != "" && !strings.Contains(n.value, "*") && n.value == value {
			return n
		}
	}
	for _, n := range level {
		if n.key == key && strings.Contains(n.value, "*") && glob(n.value, value) {
			return n
		}
	}
	for _, n := range level {
		if n.key == key && n.value == "" {
			return n
		}
	}
	return nil
}

// glob is the textbook recursive matcher: '*' matches any run of bytes.
func glob(pattern, s string) bool {
	if pattern == "" {
		return s == ""
	}
	if pattern[0] == '*' {
		for i := 0; i <= len(s); i++ {
			if glob(pattern[1:], s[i:]) {
				return true
			}
		}
		return false
	}
	return s != "" && s[0] == pattern[0] && glob(pattern[1:], s[1:])
}

// matchKeys and matchValues are what the fuzzer picks from, besides its own
// bytes: the tree's keys, its exact values and its patterns.
var matchKeys, matchValues, matchPatterns = func() (keys, values, patterns []string) {
	var walk func([]*mnode)
	walk = func(nodes []*mnode) {
		for _, n := range nodes {
			if !slices.Contains(keys, n.key) {
				keys = append(keys, n.key)
			}
			switch {
			case strings.Contains(n.value, "*"):
				patterns = append(patterns, n.value)
			case n.value != "":
				values = append(values, n.value)
			}
			walk(n.children)
		}
	}
	walk(matchTree)
	return keys, values, patterns
}()

// maxFuzzValue bounds values so the reference glob stays fast.
const maxFuzzValue = 64

// fuzzEntries derives 1-3 entries from the fuzz inputs. Byte i of modes
// (i < 3) chooses entry i's key: the fuzzer's (high bit set) or one of the
// tree's; byte 3+i chooses its value: the fuzzer's, an exact value of the
// tree, a pattern of the tree with its stars filled from the fuzzer's string
// (split at ','), or an exact value with the fuzzer's string appended.
func fuzzEntries(modes uint64, n uint8, kv [3][2]string) []fuzzEntry {
	entries := make([]fuzzEntry, 1+int(n)%3)
	for i := range entries {
		kb, vb := byte(modes>>(8*i)), byte(modes>>(8*(3+i)))
		key, raw := kv[i][0], kv[i][1]
		if kb&0x80 == 0 {
			key = matchKeys[int(kb)%len(matchKeys)]
		}
		value := raw
		switch vb >> 6 {
		case 1:
			value = matchValues[int(vb)%len(matchValues)]
		case 2:
			p := matchPatterns[int(vb)%len(matchPatterns)]
			fill := strings.SplitN(raw, ",", strings.Count(p, "*"))
			var b strings.Builder
			for j, part := range strings.Split(p, "*") {
				if j > 0 && j-1 < len(fill) {
					b.WriteString(fill[j-1])
				}
				b.WriteString(part)
			}
			value = b.String()
		case 3:
			value = matchValues[int(vb)%len(matchValues)] + raw
		}
		if len(value) > maxFuzzValue {
			value = value[:maxFuzzValue]
		}
		entries[i] = fuzzEntry{key, value}
	}
	return entries
}

// FuzzMatch checks Match against refMatch on a fixed tree.
func FuzzMatch(f *testing.F) {
	c, err := config.Parse("match.yaml", []byte(matchYAMLOf(matchTree)), config.Defaults{})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []struct {
		modes uint64
		n     uint8
		kv    [3][2]string
	}{
		{0x80_80_80, 0, [3][2]string{{"path", "/api/v1/users"}}},
		{0x80_80_80, 0, [3][2]string{{"path", "/api/v2"}}},
		{0x80_80_80, 0, [3][2]string{{"path", "/v2/users"}}},
		{0x80_80_80, 0, [3][2]string{{"path", "/aXbYc"}}},
		{0x80_80_80, 0, [3][2]string{{"path", "/acb"}}},
		{0x80_80_80, 0, [3][2]string{{"path", "x"}}},
		{0x80_80_80, 1, [3][2]string{{"path", "/health"}, {"user", "bob"}}},
		{0x80_80_80, 2, [3][2]string{{"path", "/h"}, {"user", "admin"}, {"action", "delete"}}},
		{0x80_80_80, 0, [3][2]string{{"file", "x.tar.gz"}}},
		{0x80_80_80, 0, [3][2]string{{"file", "aba"}}},
		{0x80_80_80, 0, [3][2]string{{"file", "abba"}}},
		{0x80_80_80, 1, [3][2]string{{"file", "z"}, {"mode", "rw"}}},
		{0x80_80_80, 2, [3][2]string{{"tenant", "acme"}, {"user", "root"}, {"action", "read"}}},
		{0x80_80_80, 1, [3][2]string{{"tenant", "acme"}, {"user", "robot"}}},
		{0x80_80_80, 1, [3][2]string{{"tenant", "acne"}, {"user", "x"}}},
		{0x80_80_80, 2, [3][2]string{{"tenant", "zz"}, {"plan", "paid"}, {"region", "eu-west"}}},
		{0x80_80_80, 0, [3][2]string{{"host", ""}}},
		{0x80_80_80, 0, [3][2]string{{"leaf", "x"}}},
		{0x80_80_80, 0, [3][2]string{{"nope", "x"}}},
		{0x80_c0_40_00_01_02, 2, [3][2]string{{"", ""}, {"", "a,b,c"}, {"", "x"}}},
		{0x83_82_81_00_00_00, 2, [3][2]string{{"k\x00", "v\xff"}, {"*", "*"}, {"", ""}}},
	} {
		f.Add(s.modes, s.n, s.kv[0][0], s.kv[0][1], s.kv[1][0], s.kv[1][1], s.kv[2][0], s.kv[2][1])
	}
	f.Fuzz(func(t *testing.T, modes uint64, n uint8, k1, v1, k2, v2, k3, v3 string) {
		entries := fuzzEntries(modes, n, [3][2]string{{k1, v1}, {k2, v2}, {k3, v3}})
		got := config.Match(c, matchDomain, entries)
		want := refMatch(matchTree, entries)
		if (got == nil) != (want == nil) {
			t.Fatalf("Match(%q) = %v, reference %s", entries, got, pathString(want))
		}
		if got == nil {
			return
		}
		if len(got.Levels) != len(want) {
			t.Fatalf("Match(%q) = %v, reference %s", entries, got, pathString(want))
		}
		for i, l := range got.Levels {
			if l.Key != want[i].key || l.Value != want[i].value {
				t.Fatalf("Match(%q) = %v, reference %s", entries, got, pathString(want))
			}
		}
		// Another domain never matches.
		if r := config.Match(c, matchDomain+"x", entries); r != nil {
			t.Fatalf("Match in an unknown domain = %v", r)
		}
	})
}

func pathString(path []*mnode) string {
	if path == nil {
		return "<nil>"
	}
	var parts []string
	for _, n := range path {
		parts = append(parts, n.key+"="+n.value)
	}
	return strings.Join(parts, " / ")
}
