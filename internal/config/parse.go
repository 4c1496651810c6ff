package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// The raw YAML shapes. Scalars are scalar[T] so that every value knows its
// line; structs and lists are plain so that yaml.v3's KnownFields check
// reaches them (a custom UnmarshalYAML on a struct would lose it).
type (
	rawFile struct {
		Domain      scalar[string]  `yaml:"domain"`
		Descriptors []rawDescriptor `yaml:"descriptors"`
		// The RateLimitConfig resource's name, which Envoy Gateway renders
		// beside the domain; the reference accepts it and so do we.
		Name scalar[string] `yaml:"name"`
	}
	rawDescriptor struct {
		Key            scalar[string]  `yaml:"key"`
		Value          scalar[string]  `yaml:"value"`
		RateLimit      *rawRateLimit   `yaml:"rate_limit"`
		RateLimits     []rawRateLimit  `yaml:"rate_limits"` // extension: several limits, each its own counter
		Descriptors    []rawDescriptor `yaml:"descriptors"`
		ShadowMode     scalar[bool]    `yaml:"shadow_mode"`
		DetailedMetric scalar[bool]    `yaml:"detailed_metric"`
		ValueToMetric  scalar[bool]    `yaml:"value_to_metric"`
		ShareThreshold scalar[bool]    `yaml:"share_threshold"`
		QuotaMode      scalar[bool]    `yaml:"quota_mode"`
		Metadata       yaml.Node       `yaml:"metadata"` // any mapping: see metadataStruct
	}
	rawRateLimit struct {
		Unit            scalar[string] `yaml:"unit"`
		RequestsPerUnit scalar[uint32] `yaml:"requests_per_unit"`
		Unlimited       scalar[bool]   `yaml:"unlimited"`
		Name            scalar[string] `yaml:"name"`
		Replaces        []rawReplace   `yaml:"replaces"`
		// Our extensions.
		Algorithm      scalar[string] `yaml:"algorithm"`
		UnitMultiplier scalar[uint32] `yaml:"unit_multiplier"`
		FailureMode    scalar[string] `yaml:"failure_mode"`
		RecordCosts    scalar[string] `yaml:"record_costs"`
		Burst          scalar[uint32] `yaml:"burst"`
		RefundOrder    scalar[string] `yaml:"refund_order"`
		HotKeySlices   scalar[bool]   `yaml:"hot_key_slices"`
		TimeZone       scalar[string] `yaml:"time_zone"`
		Leases         scalar[bool]   `yaml:"leases"`
		LeaseTTL       scalar[string] `yaml:"lease_ttl"`
	}
	rawReplace struct {
		Name scalar[string] `yaml:"name"`
	}
)

// yamlNames name the raw types the way the YAML reads, for messages.
var yamlNames = map[string]string{
	reflect.TypeFor[rawFile]().String():         "top level",
	reflect.TypeFor[rawDescriptor]().String():   "descriptor",
	reflect.TypeFor[[]rawDescriptor]().String(): "descriptors",
	reflect.TypeFor[rawRateLimit]().String():    "rate_limit",
	reflect.TypeFor[[]rawRateLimit]().String():  "rate_limits",
	reflect.TypeFor[rawReplace]().String():      "replaces entry",
	reflect.TypeFor[[]rawReplace]().String():    "replaces",
}

// scalar is a YAML scalar and its line. Only scalars have an UnmarshalYAML:
// yaml.v3 decodes the node it hands over with a fresh, non-strict decoder,
// which is harmless for a value without fields.
type scalar[T any] struct {
	V    T
	Line int
	Set  bool // present and not null
}

// UnmarshalYAML implements yaml.Unmarshaler.
func (s *scalar[T]) UnmarshalYAML(n *yaml.Node) error {
	_, integer := any(s.V).(uint32)
	// yaml.v3 truncates a float into an integer field (1.5 would be 1), as
	// yaml.v2 does in the reference: an integer field takes integers only.
	if n.Kind != yaml.ScalarNode || integer && n.ShortTag() != "!!int" || n.Decode(&s.V) != nil {
		return &scalarError{line: n.Line, column: n.Column, got: describe(n), want: describeType(s.V)}
	}
	s.Line, s.Set = n.Line, true
	return nil
}

// lineOr returns the line of s, or line when s is absent.
func (s scalar[T]) lineOr(line int) int {
	if s.Set {
		return s.Line
	}
	return line
}

// scalarError is a value of the wrong type. UnmarshalYAML cannot know the
// field's name: decodeError finds it from the position.
type scalarError struct {
	line, column int
	got, want    string
}

func (e *scalarError) Error() string {
	return fmt.Sprintf("line %d: got %s, want %s", e.line, e.got, e.want)
}

func describe(n *yaml.Node) string {
	switch {
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.ShortTag() == "!!null":
		return "nothing"
	}
	return strconv.Quote(n.Value)
}

func describeType(v any) string {
	switch v.(type) {
	case bool:
		return "true or false"
	case uint32:
		return "an integer from 0 to 4294967295"
	}
	return "a string"
}

// add parses one file and adds its domains: one per YAML document, as Envoy
// Gateway renders several RateLimitConfig resources into one file (the
// reference reads only a file's first document and ignores the others).
func (b *builder) add(file string, data []byte) error {
	roots, err := documents(file, data)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	for _, root := range roots {
		var raw rawFile
		// The decoder sees the same documents, empty ones included.
		if err := dec.Decode(&raw); err != nil {
			return decodeError(file, root, err)
		}
		if root.ShortTag() == "!!null" {
			continue // an empty document, e.g. after a trailing "---"
		}
		if err := b.addDomain(file, root, &raw); err != nil {
			return err
		}
	}
	b.files = append(b.files, file)
	fmt.Fprintf(b.hash, "%d:%s%d:", len(file), file, len(data))
	b.hash.Write(data)
	return nil
}

// addDomain adds one document's domain, or merges it into the domain of
// that name when Defaults.MergeDomains is set (as the reference's
// MERGE_DOMAIN_CONFIG: the document's top-level descriptors join the
// domain's, and one that is already there is a duplicate).
func (b *builder) addDomain(file string, root *yaml.Node, raw *rawFile) error {
	p := &parser{file: file, defaults: b.defaults, warnings: &b.warnings}
	if err := p.required(raw.Domain, "domain", root.Line); err != nil {
		return err
	}
	name := raw.Domain.V
	p.domain = b.domains[name]
	switch {
	case p.domain != nil && !b.defaults.MergeDomains:
		return p.errorf(raw.Domain.Line, "domain %q already defined in %s (merging one domain's files is off)", name, p.domain.source)
	case p.domain == nil:
		p.domain = &domain{
			name:   name,
			source: fmt.Sprintf("%s:%d", file, raw.Domain.Line),
			root:   level{},
			top:    map[[2]string]site{},
		}
	}
	if err := p.descriptors(raw.Descriptors, p.domain.root, nil, root.Line, p.domain.top); err != nil {
		return err
	}
	b.domains[name] = p.domain
	return nil
}

// documents returns the top-level node of each YAML document of data: a
// mapping, or a null node for an empty document. Parsing into nodes first
// also gives decodeError the positions of the keys.
func documents(file string, data []byte) ([]*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var roots []*yaml.Node
	empty := true
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); err != nil {
			if !errors.Is(err, io.EOF) {
				return nil, yamlError(file, err.Error())
			}
			break
		}
		root := doc.Content[0]
		switch {
		case root.ShortTag() == "!!null": // empty: skipped
		case root.Kind != yaml.MappingNode:
			return nil, errorAt(file, root.Line, "top level must be a mapping with domain and descriptors, got %s", describe(root))
		default:
			empty = false
		}
		roots = append(roots, root)
	}
	if empty {
		return nil, errorAt(file, 1, "empty file, want a mapping with domain and descriptors")
	}
	return roots, nil
}

// decodeError rewrites an error of the strict decoding into our form; root is
// the same file parsed by document.
func decodeError(file string, root *yaml.Node, err error) error {
	var se *scalarError
	var te *yaml.TypeError
	switch {
	case errors.As(err, &se):
		return errorAt(file, se.line, "%s: got %s, want %s", keyAt(root, se.line, se.column), se.got, se.want)
	case errors.As(err, &te):
		return yamlError(file, te.Errors[0]) // the first is enough to fix the file
	}
	return yamlError(file, err.Error())
}

// keyAt returns the key of the mapping entry whose value is at line:column.
func keyAt(n *yaml.Node, line, column int) string {
	for i, c := range n.Content {
		if n.Kind == yaml.MappingNode && i%2 == 1 && c.Line == line && c.Column == column {
			return n.Content[i-1].Value
		}
		if k := keyAt(c, line, column); k != "" {
			return k
		}
	}
	return ""
}

var (
	// (?s): a key may hold a line break, and the message then spans lines.
	lineMessage  = regexp.MustCompile(`(?s)^(?:yaml: )?line (\d+): (.*)$`)
	fieldMessage = regexp.MustCompile(`(?s)^field (.+) not found in type (\S+)$`)
	typeMessage  = regexp.MustCompile(`^cannot unmarshal !!\w+.* into (\S+)$`)
)

// yamlError rewrites one of yaml.v3's messages, e.g. "line 7: field foo not
// found in type config.rawRateLimit", into ours: "FILE:7: unknown field "foo"
// in rate_limit".
func yamlError(file, msg string) error {
	m := lineMessage.FindStringSubmatch(msg)
	if m == nil {
		return fmt.Errorf("%s: %s", file, strings.TrimPrefix(msg, "yaml: "))
	}
	line, msg := m[1], m[2]
	if f := fieldMessage.FindStringSubmatch(msg); f != nil {
		msg = fmt.Sprintf("unknown field %q in %s", f[1], yamlNames[f[2]])
	} else if t := typeMessage.FindStringSubmatch(msg); t != nil && yamlNames[t[1]] != "" {
		shape := "mapping"
		if strings.HasPrefix(t[1], "[]") {
			shape = "list"
		}
		msg = fmt.Sprintf("%s must be a %s", yamlNames[t[1]], shape)
	}
	return fmt.Errorf("%s:%s: %s", file, line, msg)
}

func errorAt(file string, line int, format string, args ...any) error {
	return fmt.Errorf("%s:%d: %s", file, line, fmt.Sprintf(format, args...))
}

// parser validates and indexes one document's raw content.
type parser struct {
	file     string
	defaults Defaults
	domain   *domain
	warnings *[]string // the builder's
}

func (p *parser) errorf(line int, format string, args ...any) error {
	return errorAt(p.file, line, format, args...)
}

// warnf records something the reference accepts and so do we, but that is
// most likely a mistake.
func (p *parser) warnf(line int, format string, args ...any) {
	*p.warnings = append(*p.warnings, fmt.Sprintf("%s:%d: %s", p.file, line, fmt.Sprintf(format, args...)))
}

// required checks a string field that must be present and non-empty; line is
// reported when it is absent.
func (p *parser) required(s scalar[string], what string, line int) error {
	switch {
	case !s.Set:
		return p.errorf(line, "%s is missing", what)
	case s.V == "":
		return p.errorf(s.Line, "%s is empty", what)
	}
	return nil
}

// site is where something is defined, for duplicate messages.
type site struct {
	file string
	line int
}

// descriptors validates one level of descriptors and adds them to lvl. path
// leads to the level; line is its parent's, reported for a descriptor without
// a line of its own. seen holds the (key, value) pairs already at this level:
// the domain's top level carries them over from the files merged before.
func (p *parser) descriptors(raws []rawDescriptor, lvl level, path []Level, line int, seen map[[2]string]site) error {
	for i := range raws {
		rd := &raws[i]
		if err := p.required(rd.Key, "descriptor key", rd.Value.lineOr(line)); err != nil {
			return err
		}
		l := Level{
			Key:            rd.Key.V,
			Value:          rd.Value.V,
			Wildcard:       strings.Contains(rd.Value.V, "*"),
			ShareThreshold: rd.ShareThreshold.V,
			ValueToMetric:  rd.ValueToMetric.V,
		}
		if l.ShareThreshold && !l.Wildcard {
			return p.errorf(rd.ShareThreshold.Line, "share_threshold needs a wildcard value (with '*'), got %q", l.Value)
		}
		id := [2]string{l.Key, l.Value}
		if at, dup := seen[id]; dup {
			first := fmt.Sprintf("line %d", at.line)
			if at.file != p.file {
				first = fmt.Sprintf("%s:%d", at.file, at.line)
			}
			if l.Value == "" {
				return p.errorf(rd.Key.Line, "duplicate descriptor key %q (first at %s)", l.Key, first)
			}
			return p.errorf(rd.Key.Line, "duplicate descriptor key %q value %q (first at %s)", l.Key, l.Value, first)
		}
		seen[id] = site{p.file, rd.Key.Line}

		metadata, err := p.metadata(&rd.Metadata)
		if err != nil {
			return err
		}
		n := &node{}
		lvl.add(l, n)
		here := append(path[:len(path):len(path)], l) // a copy: each rule owns its Levels
		if rd.RateLimit != nil || len(rd.RateLimits) > 0 {
			rules, err := p.rules(rd, here)
			if err != nil {
				return err
			}
			for _, r := range rules {
				r.Metadata = metadata
			}
			n.rule = rules[0]
			p.domain.rules = append(p.domain.rules, rules...)
		} else if metadata != nil {
			// The reference ignores it too: only a matched rate_limit's
			// metadata reaches an answer.
			p.warnf(rd.Metadata.Line, "metadata on a descriptor without rate_limit has no effect")
		}
		if len(rd.Descriptors) > 0 {
			n.children = level{}
			if err := p.descriptors(rd.Descriptors, n.children, here, rd.Key.Line, make(map[[2]string]site, len(rd.Descriptors))); err != nil {
				return err
			}
		}
	}
	return nil
}

// rules validates the limits of rd, a descriptor at the end of levels: its
// rate_limit, then each of its rate_limits. Several limits each have their
// own counter, so no two may share an algorithm and a window, nor two be
// keyed as the reference keys, and none may be unlimited.
func (p *parser) rules(rd *rawDescriptor, levels []Level) ([]*Rule, error) {
	var raws []*rawRateLimit
	if rd.RateLimit != nil {
		raws = append(raws, rd.RateLimit)
	}
	for i := range rd.RateLimits {
		raws = append(raws, &rd.RateLimits[i])
	}
	rules := make([]*Rule, len(raws))
	for i, rl := range raws {
		r, err := p.rule(rd, rl, levels)
		if err != nil {
			return nil, err
		}
		rules[i] = r
		if len(raws) == 1 {
			break
		}
		line := firstLine(rl, rd.Key.Line)
		if r.Unlimited {
			return nil, p.errorf(line, "a descriptor with several limits cannot have an unlimited one")
		}
		if r.Leases {
			// One lease id per descriptor in an answer, one settlement per
			// stream-done descriptor: the lease is the descriptor's.
			return nil, p.errorf(line, "a descriptor with several limits cannot have one with leases")
		}
		for _, prev := range rules[:i] {
			if prev.Algorithm.ReferenceKeys() && r.Algorithm.ReferenceKeys() {
				// Its keys name no window length: both would count at one key
				// whenever their windows start together.
				return nil, p.errorf(line, "a descriptor has one limit of algorithm %s (envoyproxy/ratelimit's keys, "+
					"one per descriptor); give the others another algorithm", r.Algorithm)
			}
			// A calendar window's key names its calendar, not its length
			// (12 months and a year share one).
			if prev.Algorithm == r.Algorithm && prev.Calendar() == r.Calendar() &&
				(!prev.Calendar().IsZero() || prev.Window() == r.Window()) {
				return nil, p.errorf(line, "two limits of one descriptor with algorithm %s and a window of %v would share one counter", r.Algorithm, r.Window())
			}
		}
		// Each limit is a rule of its own in metrics and /rlconfig.
		r.path += fmt.Sprintf(" [%d]", i)
	}
	for _, r := range rules {
		r.limits = rules
	}
	return rules, nil
}

// firstLine returns the line of rl's first field, or line when it has none.
func firstLine(rl *rawRateLimit, line int) int {
	first := 0
	for _, l := range []int{rl.Unit.Line, rl.RequestsPerUnit.Line, rl.Unlimited.Line, rl.Name.Line, rl.Algorithm.Line,
		rl.UnitMultiplier.Line, rl.FailureMode.Line, rl.RecordCosts.Line, rl.RefundOrder.Line, rl.HotKeySlices.Line,
		rl.TimeZone.Line} {
		if l > 0 && (first == 0 || l < first) {
			first = l
		}
	}
	if first == 0 {
		return line
	}
	return first
}

// rule validates rl, a limit of rd, a descriptor at the end of levels.
func (p *parser) rule(rd *rawDescriptor, rl *rawRateLimit, levels []Level) (*Rule, error) {
	line := rd.Key.Line // reported for an absent field
	r := &Rule{
		Domain:          p.domain.name,
		Levels:          levels,
		Name:            rl.Name.V,
		RequestsPerUnit: rl.RequestsPerUnit.V,
		UnitMultiplier:  1,
		Algorithm:       p.defaults.Algorithm,
		FailureMode:     p.defaults.FailureMode,
		RecordCosts:     p.defaults.RecordCosts,
		Unlimited:       rl.Unlimited.V,
		ShadowMode:      rd.ShadowMode.V,
		QuotaMode:       rd.QuotaMode.V,
		DetailedMetric:  rd.DetailedMetric.V,
		ValueToMetric:   rd.ValueToMetric.V,
		Source:          fmt.Sprintf("%s:%d", p.file, line),
		path:            rulePath(levels),
		statKey:         statKey(p.domain.name, levels),
	}
	for _, rp := range rl.Replaces {
		switch rp.Name.V {
		case "":
			return nil, p.errorf(rp.Name.lineOr(line), "replaces entry has an empty name")
		case r.Name:
			return nil, p.errorf(rp.Name.Line, "replaces names this rule itself (%q)", r.Name)
		}
		r.Replaces = append(r.Replaces, rp.Name.V)
		r.replacesAt = append(r.replacesAt, fmt.Sprintf("%s:%d", p.file, rp.Name.Line))
	}
	if r.Unlimited {
		if err := p.unlimited(rl); err != nil {
			return nil, err
		}
		// The reference ignores requests_per_unit beside unlimited: true.
		r.RequestsPerUnit = 0
		return r, nil
	}

	if !rl.Unit.Set {
		return nil, p.errorf(line, "rate_limit unit is missing")
	}
	var err error
	if r.Unit, err = ParseUnit(rl.Unit.V); err != nil {
		return nil, p.errorf(rl.Unit.Line, "%v", err)
	}
	if !rl.RequestsPerUnit.Set {
		// The reference reads a missing one as 0, which denies every
		// request: that must be written, not forgotten.
		return nil, p.errorf(line, "rate_limit requests_per_unit is missing (0 denies every request, unlimited: true admits all)")
	}
	if rl.UnitMultiplier.Set {
		if r.UnitMultiplier = rl.UnitMultiplier.V; r.UnitMultiplier == 0 {
			return nil, p.errorf(rl.UnitMultiplier.Line, "unit_multiplier must be at least 1")
		}
		if time.Duration(r.UnitMultiplier) > MaxWindow/r.Unit.Duration() {
			return nil, p.errorf(rl.UnitMultiplier.Line, "unit_multiplier %d makes the window longer than %d years",
				r.UnitMultiplier, MaxWindow/(365*24*time.Hour))
		}
	}
	if rl.Algorithm.Set {
		if r.Algorithm, err = ParseAlgorithm(rl.Algorithm.V); err != nil {
			return nil, p.errorf(rl.Algorithm.Line, "%v", err)
		}
	}
	if rl.FailureMode.Set {
		if r.FailureMode, err = ParseFailureMode(rl.FailureMode.V); err != nil {
			return nil, p.errorf(rl.FailureMode.Line, "%v", err)
		}
	}
	if rl.RecordCosts.Set {
		if r.RecordCosts, err = ParseCostRecording(rl.RecordCosts.V); err != nil {
			return nil, p.errorf(rl.RecordCosts.Line, "%v", err)
		}
	}
	if err := p.burst(r, rl); err != nil {
		return nil, err
	}
	if err := p.refundOrder(r, rl); err != nil {
		return nil, err
	}
	if err := p.timeZone(r, rl); err != nil {
		return nil, err
	}
	if err := p.leases(r, rl); err != nil {
		return nil, err
	}
	r.NoSlices = rl.HotKeySlices.Set && !rl.HotKeySlices.V
	if err := r.Algorithm.CheckLimit(r.RequestsPerUnit); err != nil {
		return nil, p.errorf(rl.RequestsPerUnit.Line, "requests_per_unit %v", err)
	}
	return r, nil
}

// burst sets the bucket size of a token bucket rule (gcra): rate_limit.burst,
// by default requests_per_unit (a full window's worth). Other algorithms
// have no bucket.
func (p *parser) burst(r *Rule, rl *rawRateLimit) error {
	if !r.Algorithm.Bucket() {
		if rl.Burst.Set {
			how := "algorithm is " + r.Algorithm.String()
			if !rl.Algorithm.Set {
				how = "default algorithm is " + r.Algorithm.String() + "; add algorithm: " + bucketNames[0]
			}
			return p.errorf(rl.Burst.Line, "burst applies only to algorithm %s, and this rule's %s", strings.Join(bucketNames, " or "), how)
		}
		return nil
	}
	r.Burst = r.RequestsPerUnit
	if !rl.Burst.Set {
		return nil
	}
	if r.Burst = rl.Burst.V; r.Burst == 0 {
		return p.errorf(rl.Burst.Line, "burst must be greater than 0")
	}
	// The bucket's size in time: the store keeps it, and a charge's refund
	// token, in bounded numbers.
	if float64(r.Burst)*float64(r.Window())/float64(r.RequestsPerUnit) > float64(MaxWindow) {
		return p.errorf(rl.Burst.Line, "burst %d takes more than %d years to refill at %d per %v",
			r.Burst, MaxWindow/(365*24*time.Hour), r.RequestsPerUnit, r.Window())
	}
	return nil
}

// refundOrder reads rate_limit.refund_order: which units a refund
// (is_negative_hits) gives back. "newest" (the default) takes back a recent
// charge; "oldest", for concurrency limits, frees the longest held seat, so
// that the seats left are the most recent ones (docs/budgets.md,
// "Concurrency limits"). Only the log keeps its units in order, and only
// recorded acquisitions keep each release matched by a seat.
func (p *parser) refundOrder(r *Rule, rl *rawRateLimit) error {
	if !rl.RefundOrder.Set {
		return nil
	}
	switch rl.RefundOrder.V {
	case "newest":
	case "oldest":
		r.RefundOldest = true
	default:
		return p.errorf(rl.RefundOrder.Line, "refund_order %q: want newest or oldest", rl.RefundOrder.V)
	}
	if r.Algorithm != SlidingWindowLog {
		return p.errorf(rl.RefundOrder.Line, "refund_order applies only to algorithm %s, and this rule's algorithm is %s",
			SlidingWindowLog, r.Algorithm)
	}
	if r.RefundOldest && r.RecordCosts == RecordNoCosts {
		how := "record_costs: never"
		if !rl.RecordCosts.Set {
			how = "the default record_costs never; add record_costs: descriptor"
		}
		return p.errorf(rl.RefundOrder.Line,
			"refund_order: oldest needs recorded acquisitions (a denied one takes no seat, and its release frees another's), and this rule has %s", how)
	}
	return nil
}

// timeZone reads rate_limit.time_zone, the zone whose calendar a fixed
// window of days, weeks, months or years follows. It has no effect
// elsewhere (sliding windows and buckets have no edges, shorter units no
// midnight, the reference's keys no zone), so it is refused there rather
// than ignored.
func (p *parser) timeZone(r *Rule, rl *rawRateLimit) error {
	if !rl.TimeZone.Set {
		return nil
	}
	if r.Algorithm != FixedWindow {
		how := "algorithm is " + r.Algorithm.String()
		if !rl.Algorithm.Set {
			how = "default algorithm is " + r.Algorithm.String() + "; add algorithm: " + FixedWindow.String()
		}
		return p.errorf(rl.TimeZone.Line, "time_zone applies only to algorithm %s (calendar windows), and this rule's %s", FixedWindow, how)
	}
	if r.Unit < Day {
		return p.errorf(rl.TimeZone.Line, "time_zone applies only to units day, week, month and year, and this rule's unit is %s",
			strings.ToLower(r.Unit.String()))
	}
	zone, err := loadZone(rl.TimeZone.V)
	if err != nil {
		return p.errorf(rl.TimeZone.Line, "%v", err)
	}
	r.Zone = zone
	return nil
}

// leases reads rate_limit.leases and lease_ttl: a rule whose acquisitions
// are leases (seats of a concurrency limit, reservations of an estimated
// cost), each answered with an id that its stream-done call settles, and
// that frees itself lease_ttl after it was taken (by default the window;
// docs/budgets.md). Only the log names its units; a lease is released by
// its id, never by refund_order.
func (p *parser) leases(r *Rule, rl *rawRateLimit) error {
	if rl.LeaseTTL.Set && !rl.Leases.V {
		return p.errorf(rl.LeaseTTL.Line, "lease_ttl applies only to a rule with leases: true")
	}
	if !rl.Leases.V {
		return nil
	}
	if r.Algorithm != SlidingWindowLog {
		return p.errorf(rl.Leases.Line, "leases apply only to algorithm %s, and this rule's algorithm is %s",
			SlidingWindowLog, r.Algorithm)
	}
	if rl.RefundOrder.Set {
		return p.errorf(rl.RefundOrder.Line, "refund_order does not apply to a rule with leases: a lease is freed by its id")
	}
	if rl.RecordCosts.Set {
		return p.errorf(rl.RecordCosts.Line, "record_costs does not apply to a rule with leases: a settlement records its actual cost always")
	}
	r.Leases = true
	if rl.LeaseTTL.Set {
		d, err := time.ParseDuration(rl.LeaseTTL.V)
		if err != nil || d < time.Millisecond || d > MaxWindow {
			return p.errorf(rl.LeaseTTL.Line, "lease_ttl %q: want a duration from 1ms to %d years (e.g. 30s, 5m)",
				rl.LeaseTTL.V, MaxWindow/(365*24*time.Hour))
		}
		if d > r.Window() {
			return p.errorf(rl.LeaseTTL.Line, "lease_ttl %v is longer than the rule's window %v: a lease counts within its window; make the window longer",
				d, r.Window())
		}
		r.LeaseTTL = d
	}
	return nil
}

// unlimited refuses the fields that make no sense for an unlimited rule.
// requests_per_unit is not one of them: the reference ignores it there. Nor
// is a unit that names none, "" or UNKNOWN: the RateLimitConfig proto's
// zero value, which the reference accepts beside unlimited.
func (p *parser) unlimited(rl *rawRateLimit) error {
	noUnit := rl.Unit.V == "" || strings.EqualFold(rl.Unit.V, "UNKNOWN")
	for _, f := range []struct {
		name string
		set  bool
		line int
	}{
		{"unit", rl.Unit.Set && !noUnit, rl.Unit.Line},
		{"unit_multiplier", rl.UnitMultiplier.Set, rl.UnitMultiplier.Line},
		{"algorithm", rl.Algorithm.Set, rl.Algorithm.Line},
		{"failure_mode", rl.FailureMode.Set, rl.FailureMode.Line},
		{"record_costs", rl.RecordCosts.Set, rl.RecordCosts.Line},
		{"burst", rl.Burst.Set, rl.Burst.Line},
		{"refund_order", rl.RefundOrder.Set, rl.RefundOrder.Line},
		{"hot_key_slices", rl.HotKeySlices.Set, rl.HotKeySlices.Line},
		{"time_zone", rl.TimeZone.Set, rl.TimeZone.Line},
		{"leases", rl.Leases.Set, rl.Leases.Line},
		{"lease_ttl", rl.LeaseTTL.Set, rl.LeaseTTL.Line},
	} {
		if f.set {
			return p.errorf(f.line, "should not specify rate limit %s when unlimited", f.name)
		}
	}
	return nil
}
