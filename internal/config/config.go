// Package config loads envoyproxy/ratelimit's YAML rate limit configuration,
// plus a few extensions (algorithm, unit_multiplier, failure_mode, burst,
// rate_limits, record_costs, time_zone, leases, metadata), validates it and
// indexes it so that a request descriptor is matched without allocating
// (match.go); [BucketEntries] (bucket.go) puts an RLQS bucket id, a map, in
// the order the domain's tree nests its keys. A config comes from files
// ([Load], [Parse]) or from documents delivered otherwise, such as xDS
// resources ([ParseDocuments]); [Watch] reloads files when they change.
// Which files of a directory make a config is a [FileSet] (files.go): the
// *.yaml and *.yml in it, or every file under it as the reference reads its
// directory. The algorithms a rule may name ([Algorithm], enums.go) come
// from internal/algorithm's table: validating a config needs neither the
// Lua scripts nor a store. A fixed window of weeks, months or years follows
// the calendar of a time zone ([Calendar], calendar.go), whose edges the
// limiter sends to the store.
package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"
)

// MaxWindow bounds a window. The store computes in microseconds of Unix
// time, and Lua numbers stay exact below 2^53: Unix time plus a window of
// this length stays far below, and every duration fits a time.Duration.
const MaxWindow = 100 * 365 * 24 * time.Hour

// Defaults are the values used where a rule does not say, which files
// make a config and how they combine. The zero value means
// SlidingWindowCounter, FailureDefer, RecordDescriptorCosts, YAMLFiles, and
// a domain defined twice is an error.
type Defaults struct {
	Algorithm   Algorithm
	FailureMode FailureMode
	RecordCosts CostRecording
	// MergeDomains merges the documents that define one domain, as the
	// reference's MERGE_DOMAIN_CONFIG: their top-level descriptors join,
	// and one (key, value) defined twice at the top is still an error.
	MergeDomains bool
	// Files are the files of a directory that Load reads.
	Files FileSet
	// Regions is how many regions share a global rule's limit, each on its
	// own store with a ledger between them (internal/regions); 0 means no
	// ledger, and a global rule is refused.
	Regions int
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
	Unit            Unit           // zero when Unlimited
	UnitMultiplier  uint32         // >= 1 (1 when not set)
	Algorithm       Algorithm      // the rule's, or Defaults.Algorithm
	Burst           uint32         // GCRA only: the bucket's size, rate_limit.burst or RequestsPerUnit; 0 otherwise
	FailureMode     FailureMode    // the rule's, or Defaults.FailureMode
	RecordCosts     CostRecording  // the rule's, or Defaults.RecordCosts
	NoSlices        bool           // hot_key_slices: false: never decided from a hot key's slice (internal/hotkeys' Slices)
	Zone            *time.Location // time_zone: the calendar of a fixed window of days or longer (Calendar); nil is UTC
	Leases          bool           // leases: true (the log only): acquisitions are leases, settled by the id the answer carries
	LeaseTTL        time.Duration  // lease_ttl: how long a lease lives unsettled; 0: the window
	Global          *Global        // global: true: one limit across regions (internal/regions); nil otherwise
	Unlimited       bool
	ShadowMode      bool
	// QuotaMode: the rule's denial denies its request only when every
	// quota-mode descriptor of the request is denied (quota_mode).
	QuotaMode      bool
	Replaces       []string // names of rules this one replaces
	DetailedMetric bool     // detailed_metric: the reference's metrics name the rule by the request's values
	ValueToMetric  bool     // value_to_metric of the rule's own level (see Level.ValueToMetric)
	// Metadata is the descriptor's metadata, for answers' dynamic_metadata;
	// nil when none. Shared by every answer: never modify it.
	Metadata *structpb.Struct
	Source   string // "path/to/file.yaml:LINE" of the descriptor's key

	path       string
	statKey    string
	replacesAt []string // FILE:LINE of each Replaces entry
	limits     []*Rule  // every limit of the descriptor, this one among them
}

// Global is a rule's limit across regions (rate_limit.global): each region
// decides on its own store, within an allowance leased from the ledger,
// every region's store holding its count and the ledger their allowances.
type Global struct {
	// Share (regional_share, 0 to 1) is the part of the limit each region
	// keeps whatever happens: reserved for every region on the ledger, it
	// decides a key's first requests in a region, and a cut region's.
	Share float64
	// WhenCut (when_cut) is how a region decides once its allowance ran
	// out unrenewed, cut from the ledger.
	WhenCut CutMode
}

// CutMode is how a region cut from the ledger decides a global rule.
type CutMode uint8

// The modes of rate_limit.when_cut.
const (
	// CutShare, the default: within the region's share (none at a share
	// of 0), which the ledger keeps for it: the regions together stay
	// within the limit.
	CutShare CutMode = iota + 1
	// CutDeny: nothing, the region's share left unused.
	CutDeny
	// CutFailureMode: as the rule's failure mode says when the store
	// fails: deny denies; allow decides with the whole limit, as a region
	// alone would, so that each cut region may admit up to the limit.
	CutFailureMode
)

var cutModeNames = []string{CutShare: "share", CutDeny: "deny", CutFailureMode: "failure_mode"}

// ParseCutMode returns the mode named s, spelled exactly as in the config
// file.
func ParseCutMode(s string) (CutMode, error) {
	return parseEnum[CutMode]("when_cut", s, cutModeNames, equal)
}

// String returns the name ParseCutMode accepts.
func (m CutMode) String() string { return enumString("CutMode", m, cutModeNames) }

// Limits returns every limit of the rule's descriptor node, in file order,
// the rule among them: one, unless the descriptor has rate_limits. Match
// returns the first; each has a counter of its own. Callers must not modify
// the slice.
func (r *Rule) Limits() []*Rule {
	if r.limits == nil {
		return []*Rule{r} // a Rule not made by Load
	}
	return r.limits
}

// Window returns the length of the rule's window: zero when Unlimited. A
// window that follows the calendar (Calendar) has the unit's nominal length
// here: 30 days for a month.
func (r *Rule) Window() time.Duration {
	return r.Unit.Duration() * time.Duration(r.UnitMultiplier)
}

// Calendar returns the calendar the rule's windows follow: the zero
// Calendar for windows of a fixed length (see CalendarOf).
func (r *Rule) Calendar() Calendar {
	return CalendarOf(r.Algorithm, r.Unit, r.UnitMultiplier, r.Zone)
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
	warnings []string
}

// Load reads path: a file, or the files of a directory that d.Files says,
// in name order. One file that fails to parse fails the whole config, with
// the file's name in the error.
func Load(path string, d Defaults) (*Config, error) {
	files, skipped, err := d.Files.list(path)
	if err != nil {
		return nil, err
	}
	b := newBuilder(d)
	b.warnings = skipped
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil && d.Files != YAMLFiles && f != path {
			// As the reference: a file it cannot read is left out.
			b.warnings = append(b.warnings, notRead(f, err))
			continue
		}
		if err != nil {
			return nil, err
		}
		if err := b.add(f, data); err != nil {
			return nil, err
		}
	}
	if len(b.files) == 0 {
		return nil, fmt.Errorf("%s: none of its files could be read: %s", path, strings.Join(b.warnings, "; "))
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

// Document is one config held in memory rather than in a file, e.g. a
// resource received over xDS.
type Document struct {
	Name string // stands for the file name: in messages, Files and rule sources
	Data []byte // the YAML a config file would hold
}

// ParseDocuments reads docs, in the order given, into one Config, exactly as
// Load reads the files of a directory. No documents make an empty Config,
// which limits nothing.
func ParseDocuments(docs []Document, d Defaults) (*Config, error) {
	b := newBuilder(d)
	for _, doc := range docs {
		if err := b.add(doc.Name, doc.Data); err != nil {
			return nil, err
		}
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

// Warnings returns "FILE:LINE: message" for each thing the config holds
// that the reference accepts, and so does Load, but that has no effect: a
// replaces entry naming no rule of its domain, metadata without rate_limit.
func (c *Config) Warnings() []string { return slices.Clone(c.warnings) }

// builder accumulates files into a Config.
type builder struct {
	defaults Defaults
	domains  map[string]*domain
	files    []string
	hash     hash.Hash // of every file name and content added
	warnings []string
}

// domain is one domain's content while building.
type domain struct {
	name   string
	source string // FILE:LINE of the first domain field, for duplicate messages
	root   level
	top    map[[2]string]site // the (key, value) pairs of root, for duplicates across merged files
	rules  []*Rule
}

func newBuilder(d Defaults) *builder {
	if d.Algorithm == 0 {
		d.Algorithm = SlidingWindowCounter
	}
	if d.RecordCosts == 0 {
		d.RecordCosts = RecordDescriptorCosts
	}
	return &builder{defaults: d, domains: make(map[string]*domain), hash: sha256.New()}
}

func (b *builder) config() *Config {
	c := &Config{
		domains:  make(map[string]level, len(b.domains)),
		files:    b.files,
		defaults: b.defaults,
		hash:     hex.EncodeToString(b.hash.Sum(nil)[:8]),
		warnings: b.warnings,
	}
	for _, name := range slices.Sorted(maps.Keys(b.domains)) {
		d := b.domains[name]
		c.domains[name] = d.root
		c.rules = append(c.rules, d.rules...)
		c.warnings = append(c.warnings, unknownReplaces(d)...)
	}
	return c
}

// unknownReplaces warns of each replaces entry that names no rule of d:
// replaces only ever drops a rule of the same domain, matched in the same
// request, so such an entry is a typo or a leftover. The reference loads
// it without a word; so does Load, but it says so.
func unknownReplaces(d *domain) []string {
	names := map[string]bool{}
	for _, r := range d.rules {
		if r.Name != "" {
			names[r.Name] = true
		}
	}
	var warnings []string
	for _, r := range d.rules {
		for i, name := range r.Replaces {
			if !names[name] {
				warnings = append(warnings, fmt.Sprintf("%s: replaces %q, but no rule of domain %q has that name", r.replacesAt[i], name, d.name))
			}
		}
	}
	return warnings
}
