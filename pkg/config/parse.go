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
	}
	rawDescriptor struct {
		Key            scalar[string]  `yaml:"key"`
		Value          scalar[string]  `yaml:"value"`
		RateLimit      *rawRateLimit   `yaml:"rate_limit"`
		Descriptors    []rawDescriptor `yaml:"descriptors"`
		ShadowMode     scalar[bool]    `yaml:"shadow_mode"`
		DetailedMetric scalar[bool]    `yaml:"detailed_metric"`
		ValueToMetric  scalar[bool]    `yaml:"value_to_metric"`
		ShareThreshold scalar[bool]    `yaml:"share_threshold"`
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
	if n.Kind != yaml.ScalarNode || n.Decode(&s.V) != nil {
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

// add parses one file and adds its domain.
func (b *builder) add(file string, data []byte) error {
	root, err := document(file, data)
	if err != nil {
		return err
	}
	var raw rawFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&raw); err != nil {
		return decodeError(file, root, err)
	}
	p := &parser{file: file, defaults: b.defaults}
	if err := p.required(raw.Domain, "domain", root.Line); err != nil {
		return err
	}
	name := raw.Domain.V
	if prev := b.domains[name]; prev != nil {
		return p.errorf(raw.Domain.Line, "domain %q already defined in %s", name, prev.source)
	}
	p.domain = &domain{name: name, source: fmt.Sprintf("%s:%d", file, raw.Domain.Line), root: level{}}
	if err := p.descriptors(raw.Descriptors, p.domain.root, nil, root.Line); err != nil {
		return err
	}
	b.domains[name] = p.domain
	b.files = append(b.files, file)
	fmt.Fprintf(b.hash, "%d:%s%d:", len(file), file, len(data))
	b.hash.Write(data)
	return nil
}

// document returns the top-level mapping of data, which must hold exactly one
// YAML document. Parsing into nodes first also gives decodeError the
// positions of the keys.
func document(file string, data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc, next yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errorAt(file, 1, "empty file, want a mapping with domain and descriptors")
		}
		return nil, yamlError(file, err.Error())
	}
	switch err := dec.Decode(&next); {
	case err == nil:
		return nil, errorAt(file, next.Line, "more than one YAML document, want one domain per file")
	case !errors.Is(err, io.EOF):
		return nil, yamlError(file, err.Error())
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, errorAt(file, root.Line, "top level must be a mapping with domain and descriptors, got %s", describe(root))
	}
	return root, nil
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

// parser validates and indexes one file's raw content.
type parser struct {
	file     string
	defaults Defaults
	domain   *domain
}

func (p *parser) errorf(line int, format string, args ...any) error {
	return errorAt(p.file, line, format, args...)
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

// descriptors validates one level of descriptors and adds them to lvl. path
// leads to the level; line is its parent's, reported for a descriptor without
// a line of its own.
func (p *parser) descriptors(raws []rawDescriptor, lvl level, path []Level, line int) error {
	first := make(map[[2]string]int, len(raws)) // key and value → line, for duplicates
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
		if at, dup := first[id]; dup {
			if l.Value == "" {
				return p.errorf(rd.Key.Line, "duplicate descriptor key %q (first at line %d)", l.Key, at)
			}
			return p.errorf(rd.Key.Line, "duplicate descriptor key %q value %q (first at line %d)", l.Key, l.Value, at)
		}
		first[id] = rd.Key.Line

		n := &node{}
		lvl.add(l, n)
		here := append(path[:len(path):len(path)], l) // a copy: each rule owns its Levels
		if rd.RateLimit != nil {
			r, err := p.rule(rd, here)
			if err != nil {
				return err
			}
			n.rule = r
			p.domain.rules = append(p.domain.rules, r)
		}
		if len(rd.Descriptors) > 0 {
			n.children = level{}
			if err := p.descriptors(rd.Descriptors, n.children, here, rd.Key.Line); err != nil {
				return err
			}
		}
	}
	return nil
}

// rule validates the rate_limit of rd, a descriptor at the end of levels.
func (p *parser) rule(rd *rawDescriptor, levels []Level) (*Rule, error) {
	rl := rd.RateLimit
	line := rd.Key.Line // reported for an absent field
	r := &Rule{
		Domain:          p.domain.name,
		Levels:          levels,
		Name:            rl.Name.V,
		RequestsPerUnit: rl.RequestsPerUnit.V,
		UnitMultiplier:  1,
		Algorithm:       p.defaults.Algorithm,
		FailureMode:     p.defaults.FailureMode,
		Unlimited:       rl.Unlimited.V,
		ShadowMode:      rd.ShadowMode.V,
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
	}
	if r.Unlimited {
		if err := p.unlimited(rl); err != nil {
			return nil, err
		}
		return r, nil
	}

	if !rl.Unit.Set {
		return nil, p.errorf(line, "rate_limit unit is missing")
	}
	var err error
	if r.Unit, err = ParseUnit(rl.Unit.V); err != nil {
		return nil, p.errorf(rl.Unit.Line, "%v", err)
	}
	if r.RequestsPerUnit == 0 {
		return nil, p.errorf(rl.RequestsPerUnit.lineOr(line), "requests_per_unit must be greater than 0, or use unlimited: true")
	}
	if rl.UnitMultiplier.Set {
		if r.UnitMultiplier = rl.UnitMultiplier.V; r.UnitMultiplier == 0 {
			return nil, p.errorf(rl.UnitMultiplier.Line, "unit_multiplier must be at least 1")
		}
		if time.Duration(r.UnitMultiplier) > MaxWindow/r.Unit.Duration() {
			return nil, p.errorf(rl.UnitMultiplier.Line, "unit_multiplier %d makes the window longer than %d years", r.UnitMultiplier, MaxWindow/(365*24*time.Hour))
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
	if r.Algorithm == SlidingWindowLog && r.RequestsPerUnit > MaxLogLimit {
		return nil, p.errorf(rl.RequestsPerUnit.Line,
			"requests_per_unit %d is above the sliding_window_log maximum of %d (one stored member per unit); use sliding_window_counter",
			r.RequestsPerUnit, MaxLogLimit)
	}
	return r, nil
}

// unlimited refuses the fields that make no sense for an unlimited rule.
func (p *parser) unlimited(rl *rawRateLimit) error {
	for _, f := range []struct {
		name string
		set  bool
		line int
	}{
		{"unit", rl.Unit.Set, rl.Unit.Line},
		{"requests_per_unit", rl.RequestsPerUnit.V > 0, rl.RequestsPerUnit.Line},
		{"unit_multiplier", rl.UnitMultiplier.Set, rl.UnitMultiplier.Line},
		{"algorithm", rl.Algorithm.Set, rl.Algorithm.Line},
		{"failure_mode", rl.FailureMode.Set, rl.FailureMode.Line},
	} {
		if f.set {
			return p.errorf(f.line, "should not specify rate limit %s when unlimited", f.name)
		}
	}
	return nil
}
