package config

// Parsing: a file's YAML documents decoded into the raw shapes below, every
// value with its line, and yaml.v3's errors rewritten as FILE:LINE
// messages; each document is then checked by check.go.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strconv"
	"strings"

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
		Algorithm      scalar[string]  `yaml:"algorithm"`
		UnitMultiplier scalar[uint32]  `yaml:"unit_multiplier"`
		FailureMode    scalar[string]  `yaml:"failure_mode"`
		RecordCosts    scalar[string]  `yaml:"record_costs"`
		Burst          scalar[uint32]  `yaml:"burst"`
		RefundOrder    scalar[string]  `yaml:"refund_order"`
		HotKeySlices   scalar[bool]    `yaml:"hot_key_slices"`
		TimeZone       scalar[string]  `yaml:"time_zone"`
		Leases         scalar[bool]    `yaml:"leases"`
		LeaseTTL       scalar[string]  `yaml:"lease_ttl"`
		Global         scalar[bool]    `yaml:"global"`
		RegionalShare  scalar[float64] `yaml:"regional_share"`
		WhenCut        scalar[string]  `yaml:"when_cut"`
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
