// Package config loads, parses and validates rate limit configs: the YAML of
// envoyproxy/ratelimit (domains, nested descriptors, rate_limit with unit and
// requests_per_unit, shadow_mode, replaces, share_threshold, quota_mode,
// detailed_metric) with this project's extensions (algorithm,
// unit_multiplier, burst, failure_mode, rate_limits, record_costs,
// refund_order, metadata), exactly as the rate limit service reads them.
//
// A Config is built once and never changes, so one value can be read by any
// number of goroutines; a new config is a new value. Errors name the file and
// line they come from: "FILE:LINE: what is wrong".
//
// Use it to check configs in CI with the service's own parser, or to find the
// rule that applies to a descriptor (Config.Match).
package config

import (
	"time"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/pkgbridge"
)

// Options are the defaults of the rules that do not say, and how a
// directory's files combine: the service's --default-algorithm,
// --default-failure-mode, --record-costs, --merge-domains and --config-files.
// A nil *Options, and each empty field, means the service's default.
type Options struct {
	// DefaultAlgorithm is the algorithm of a rule that names none, as the
	// config names it ("sliding_window_log", "fixed_window", ...); empty
	// means "sliding_window_counter".
	DefaultAlgorithm string
	// DefaultFailureMode is the failure_mode of a rule that names none:
	// "allow", "deny", or empty to leave it to Envoy's failure_mode_deny.
	DefaultFailureMode string
	// RecordCosts is the record_costs of a rule that names none ("descriptor",
	// "always", "never"); empty means "descriptor".
	RecordCosts string
	// MergeDomains lets several files define one domain, their top-level
	// descriptors joined (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG);
	// otherwise a domain defined twice is an error.
	MergeDomains bool
	// Files says which files of a directory Load reads: "yaml" (empty: the
	// *.yaml and *.yml in it), "all" (every file under it, as
	// envoyproxy/ratelimit reads its directory) or "visible" (the same but
	// dot files and dot directories).
	Files string
}

func (o *Options) defaults() (config.Defaults, error) {
	var d config.Defaults
	if o == nil {
		return d, nil
	}
	var err error
	if o.DefaultAlgorithm != "" {
		if d.Algorithm, err = config.ParseAlgorithm(o.DefaultAlgorithm); err != nil {
			return d, err
		}
	}
	if o.DefaultFailureMode != "" {
		if d.FailureMode, err = config.ParseFailureMode(o.DefaultFailureMode); err != nil {
			return d, err
		}
	}
	if o.RecordCosts != "" {
		if d.RecordCosts, err = config.ParseCostRecording(o.RecordCosts); err != nil {
			return d, err
		}
	}
	if o.Files != "" {
		if d.Files, err = config.ParseFileSet(o.Files); err != nil {
			return d, err
		}
	}
	d.MergeDomains = o.MergeDomains
	return d, nil
}

// Config is a loaded and validated set of domains, indexed for matching.
// It is immutable and safe for concurrent use.
type Config struct {
	c *config.Config
}

// Load reads the config at path: one YAML file, or a directory of them.
func Load(path string, opts *Options) (*Config, error) {
	d, err := opts.defaults()
	if err != nil {
		return nil, err
	}
	c, err := config.Load(path, d)
	if err != nil {
		return nil, err
	}
	return &Config{c: c}, nil
}

// Parse reads one config held in memory; name stands for its file name in
// errors and in each rule's Source.
func Parse(name string, data []byte, opts *Options) (*Config, error) {
	d, err := opts.defaults()
	if err != nil {
		return nil, err
	}
	c, err := config.Parse(name, data, d)
	if err != nil {
		return nil, err
	}
	return &Config{c: c}, nil
}

func init() {
	pkgbridge.ConfigOf = func(c any) *config.Config { return c.(*Config).c }
}

// Warnings returns what the config does that is allowed but probably not
// meant (such as a rule that can never match), each "FILE:LINE: ...".
func (c *Config) Warnings() []string { return c.c.Warnings() }

// Hash identifies the config's files by their names and contents (not by
// Options): the service's Reload keeps the config in force when the new one
// has its hash.
func (c *Config) Hash() string { return c.c.Hash() }

// Rules returns every rule, in the order of the files and of the
// descriptors within them: one per descriptor with a rate_limit or
// rate_limits, however many limits it has.
func (c *Config) Rules() []Rule {
	var out []Rule
	for _, r := range c.c.Rules() {
		if r.Limits()[0] == r { // the others are its further limits
			out = append(out, Rule{r: r})
		}
	}
	return out
}

// Entry is one entry of a request's descriptor.
type Entry struct {
	// Key is the entry's key, such as "user_id" or "remote_address".
	Key string
	// Value is the entry's value, as Envoy sends it.
	Value string
}

// GetKey returns e.Key (with GetValue, what the service's matching takes of
// an entry, as of Envoy's own descriptor entries).
func (e Entry) GetKey() string { return e.Key }

// GetValue returns e.Value.
func (e Entry) GetValue() string { return e.Value }

// Match returns the rule the service applies to a descriptor of domain with
// these entries, in the request's order, and false when none applies.
func (c *Config) Match(domain string, entries ...Entry) (Rule, bool) {
	r := config.Match(c.c, domain, entries)
	if r == nil {
		return Rule{}, false
	}
	return Rule{r: r}, true
}

// Rule is one configured limit: a descriptor that has a rate_limit. The zero
// Rule is not a rule.
type Rule struct {
	r *config.Rule
}

// Limit is one of a rule's limits.
type Limit struct {
	// Requests is the number of units Window admits.
	Requests uint32
	// Window is the window's length: the unit times unit_multiplier, a
	// month 30 days and a year 365.
	Window time.Duration
	// Algorithm is the rule's algorithm as the config names it, such as
	// "sliding_window_log".
	Algorithm string
	// Burst is the GCRA bucket's size; zero for other algorithms.
	Burst uint32
	// Calendar is set when the windows follow the calendar instead of
	// Window (fixed_window's weeks, months and years, in its time_zone):
	// named as in the counter's store key, such as "1mo", "7d" or
	// "1mo@Europe/Berlin"; empty for windows of the length Window.
	Calendar string
}

// Domain returns the rule's domain.
func (r Rule) Domain() string { return r.r.Domain }

// Path identifies the rule within its domain, such as "path=/v1/* / user".
func (r Rule) Path() string { return r.r.Path() }

// Name is the rule's rate_limit.name, empty when it has none.
func (r Rule) Name() string { return r.r.Name }

// Source is where the rule is written: "FILE:LINE".
func (r Rule) Source() string { return r.r.Source }

// Unlimited reports a rule that never limits (rate_limit.unlimited).
func (r Rule) Unlimited() bool { return r.r.Unlimited }

// Shadow reports a rule in shadow mode: evaluated and counted, never denying.
func (r Rule) Shadow() bool { return r.r.ShadowMode }

// Limits returns the rule's limits: its rate_limit, then those of
// rate_limits; none when it is unlimited.
func (r Rule) Limits() []Limit {
	if r.r.Unlimited {
		return nil
	}
	all := r.r.Limits()
	out := make([]Limit, len(all))
	for i, l := range all {
		out[i] = Limit{Requests: l.RequestsPerUnit, Window: l.Window(), Algorithm: l.Algorithm.String(), Burst: l.Burst}
		if c := l.Calendar(); !c.IsZero() {
			out[i].Calendar = c.String()
		}
	}
	return out
}

// String identifies the rule for logs, such as "api: path=/v1/* / user".
func (r Rule) String() string { return r.r.String() }
