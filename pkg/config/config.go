// Package config loads envoyproxy/ratelimit's YAML rate limit configuration,
// plus a few extensions (algorithm, unit_multiplier, failure_mode), validates
// it and indexes it so that a request descriptor is matched without allocating.
package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// MaxWindow bounds a window. The store computes in microseconds of Unix
// time, and Lua numbers stay exact below 2^53: Unix time plus a window of
// this length stays far below, and every duration fits a time.Duration.
const MaxWindow = 100 * 365 * 24 * time.Hour

// MaxLogLimit bounds the limit of a sliding_window_log. The log stores one
// member per admitted unit, so memory per key, and the time one script holds
// Redis to record a heavy weighted hit, grow with the limit; beyond this the
// sliding_window_counter keeps constant memory.
const MaxLogLimit = 10_000

// Defaults are the values used where a rule does not say. The zero value means
// SlidingWindowCounter and FailureDefer.
type Defaults struct {
	Algorithm   Algorithm
	FailureMode FailureMode
}

// Level describes one step of the path from a domain's root to a rule.
type Level struct {
	Key            string
	Value          string // the configured value: "" for a key-only node, the pattern for a wildcard node
	Wildcard       bool   // Value contains '*'
	ShareThreshold bool   // share_threshold: all values matching this wildcard share one counter
	ValueToMetric  bool   // value_to_metric: the reference's metrics name this level by the request's value
}

// Rule is one configured limit: a descriptor node that has a rate_limit.
// Immutable after Load.
type Rule struct {
	Domain          string
	Levels          []Level // path from the domain root to this node, len >= 1
	Name            string  // rate_limit.name
	RequestsPerUnit uint32
	Unit            Unit        // zero when Unlimited
	UnitMultiplier  uint32      // >= 1 (1 when not set)
	Algorithm       Algorithm   // the rule's, or Defaults.Algorithm
	FailureMode     FailureMode // the rule's, or Defaults.FailureMode
	Unlimited       bool
	ShadowMode      bool
	Replaces        []string // names of rules this one replaces
	DetailedMetric  bool     // detailed_metric: the reference's metrics name the rule by the request's values
	ValueToMetric   bool     // value_to_metric of the rule's own level (see Level.ValueToMetric)
	Source          string   // "path/to/file.yaml:LINE" of the descriptor's key

	path    string
	statKey string
}

// Window returns the length of the rule's window: zero when Unlimited.
func (r *Rule) Window() time.Duration {
	return r.Unit.Duration() * time.Duration(r.UnitMultiplier)
}

// String identifies the rule for logs, e.g. "api: path=/v1/* / user".
func (r *Rule) String() string { return r.Domain + ": " + r.path }

// Path identifies the rule within its domain, e.g. "path=/v1/* / user". It
// is computed once at load, so metrics can label with it for free.
func (r *Rule) Path() string { return r.path }

// StatKey is the rule's name in envoyproxy/ratelimit's metrics (its
// FullKey): the domain, then each level's key, or key_value when the level
// has a value (a wildcard's pattern included), joined by dots.
func (r *Rule) StatKey() string { return r.statKey }

func statKey(domain string, levels []Level) string {
	var b strings.Builder
	b.WriteString(domain)
	for _, l := range levels {
		b.WriteByte('.')
		b.WriteString(l.Key)
		if l.Value != "" {
			b.WriteByte('_')
			b.WriteString(l.Value)
		}
	}
	return b.String()
}

// rulePath renders the levels leading to a rule.
func rulePath(levels []Level) string {
	var b strings.Builder
	for i, l := range levels {
		if i > 0 {
			b.WriteString(" / ")
		}
		b.WriteString(l.Key)
		if l.Value != "" {
			b.WriteString("=")
			b.WriteString(l.Value)
		}
	}
	return b.String()
}

// Config is a loaded, validated, immutable and indexed set of domains.
// Safe for concurrent use.
type Config struct {
	domains  map[string]level // the root level of each domain
	rules    []*Rule
	files    []string
	defaults Defaults
	hash     string
}

// Load reads path: a file, or a directory whose *.yaml and *.yml files (not
// subdirectories, not names starting with ".") are read in name order.
// Symlinks are followed and dot names skipped so that a Kubernetes ConfigMap
// mount, whose "..data" entry is a symlinked directory, is read once.
func Load(path string, d Defaults) (*Config, error) {
	files, err := configFiles(path)
	if err != nil {
		return nil, err
	}
	b := newBuilder(d)
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if err := b.add(f, data); err != nil {
			return nil, err
		}
	}
	return b.config(), nil
}

// Parse reads one file's content; name is the file name used in messages.
func Parse(name string, data []byte, d Defaults) (*Config, error) {
	b := newBuilder(d)
	if err := b.add(name, data); err != nil {
		return nil, err
	}
	return b.config(), nil
}

// HasDomain reports whether domain is configured.
func (c *Config) HasDomain(domain string) bool {
	_, ok := c.domains[domain]
	return ok
}

// Defaults returns the defaults the config was loaded with, zero values
// filled in; they apply to limit overrides that match no rule.
func (c *Config) Defaults() Defaults { return c.defaults }

// Hash identifies the loaded files' names and contents: equal hashes mean the
// same config.
func (c *Config) Hash() string { return c.hash }

// Rules returns every rule, ordered by domain, then as in the file.
func (c *Config) Rules() []*Rule { return slices.Clone(c.rules) }

// Files returns the files loaded, in load order.
func (c *Config) Files() []string { return slices.Clone(c.files) }

// configFiles lists the files Load reads for path.
func configFiles(path string) ([]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !info.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path) // sorted by name
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		name := e.Name()
		if ext := filepath.Ext(name); strings.HasPrefix(name, ".") || ext != ".yaml" && ext != ".yml" {
			continue
		}
		full := filepath.Join(path, name)
		info, err := os.Stat(full) // follows the symlink that e describes
		if err != nil {
			return nil, err
		}
		if !info.IsDir() {
			files = append(files, full)
		}
	}
	if len(files) == 0 {
		// Most likely a wrong path: refuse rather than limit nothing.
		return nil, fmt.Errorf("%s: no *.yaml or *.yml files", path)
	}
	return files, nil
}

// builder accumulates files into a Config.
type builder struct {
	defaults Defaults
	domains  map[string]*domain
	files    []string
	hash     hash.Hash // of every file name and content added
}

// domain is one file's content while building.
type domain struct {
	name   string
	source string // FILE:LINE of the domain field, for duplicate messages
	root   level
	rules  []*Rule
}

func newBuilder(d Defaults) *builder {
	if d.Algorithm == 0 {
		d.Algorithm = SlidingWindowCounter
	}
	return &builder{defaults: d, domains: make(map[string]*domain), hash: sha256.New()}
}

func (b *builder) config() *Config {
	c := &Config{
		domains:  make(map[string]level, len(b.domains)),
		files:    b.files,
		defaults: b.defaults,
		hash:     hex.EncodeToString(b.hash.Sum(nil)[:8]),
	}
	for _, name := range slices.Sorted(maps.Keys(b.domains)) {
		d := b.domains[name]
		c.domains[name] = d.root
		c.rules = append(c.rules, d.rules...)
	}
	return c
}
