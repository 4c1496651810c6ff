package config

import (
	"math"

	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"
)

// maxMetadataNodes bounds the nodes one descriptor's metadata expands to,
// aliases followed: a few aliases can otherwise name billions of nodes.
const maxMetadataNodes = 10_000

// metadata converts a descriptor's metadata, a mapping of anything, into
// the Struct an answer's dynamic_metadata carries; nil when absent. As the
// reference (which reads it with yaml.v2): integers and floats become
// numbers; true and false booleans, and so do YAML 1.1's plain (unquoted,
// untagged) yes, no, on, off, y and n in the spellings yaml.v2 knows; null
// null; and every other scalar, timestamps and quoted words included, its
// text. Keys are always their text. A .nan or .inf is refused: an answer
// carrying it could not be encoded as JSON.
func (p *parser) metadata(n *yaml.Node) (*structpb.Struct, error) {
	if n.Kind == 0 || n.ShortTag() == "!!null" {
		return nil, nil // absent
	}
	c := metadataConverter{p: p}
	v, err := c.value(n)
	if err != nil {
		return nil, err
	}
	s := v.GetStructValue()
	if s == nil {
		return nil, p.errorf(n.Line, "metadata must be a mapping, got %s", describe(n))
	}
	if len(s.Fields) == 0 {
		return nil, nil // as the reference: an empty mapping is no metadata
	}
	return s, nil
}

type metadataConverter struct {
	p     *parser
	nodes int
}

func (c *metadataConverter) value(n *yaml.Node) (*structpb.Value, error) {
	if c.nodes++; c.nodes > maxMetadataNodes {
		return nil, c.p.errorf(n.Line, "metadata expands to more than %d values", maxMetadataNodes)
	}
	switch n.Kind {
	case yaml.AliasNode:
		return c.value(n.Alias)
	case yaml.SequenceNode:
		l := &structpb.ListValue{Values: make([]*structpb.Value, 0, len(n.Content))}
		for _, e := range n.Content {
			v, err := c.value(e)
			if err != nil {
				return nil, err
			}
			l.Values = append(l.Values, v)
		}
		return structpb.NewListValue(l), nil
	case yaml.MappingNode:
		s := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(n.Content)/2)}
		if err := c.fields(s, n, true); err != nil {
			return nil, err
		}
		return structpb.NewStructValue(s), nil
	}
	return c.scalar(n)
}

// fields adds the entries of mapping n to s. A "<<" merge key adds the
// entries of the mappings it names that s does not have yet; explicit
// entries win over merged ones wherever they stand.
func (c *metadataConverter) fields(s *structpb.Struct, n *yaml.Node, explicit bool) error {
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		if k.Kind == yaml.AliasNode {
			k = k.Alias
		}
		if k.Kind != yaml.ScalarNode {
			return c.p.errorf(k.Line, "metadata key must be a scalar, got %s", describe(k))
		}
		if _, dup := s.Fields[k.Value]; dup && !explicit {
			continue
		}
		val, err := c.value(v)
		if err != nil {
			return err
		}
		s.Fields[k.Value] = val
	}
	for _, m := range merges {
		if m.Kind == yaml.AliasNode {
			m = m.Alias
		}
		list := []*yaml.Node{m}
		if m.Kind == yaml.SequenceNode {
			list = m.Content
		}
		for _, e := range list {
			if e.Kind == yaml.AliasNode {
				e = e.Alias
			}
			if e.Kind != yaml.MappingNode {
				return c.p.errorf(e.Line, "metadata merge (<<) needs a mapping or a list of mappings, got %s", describe(e))
			}
			if err := c.fields(s, e, false); err != nil {
				return err
			}
		}
	}
	return nil
}

// yaml11Bools are the booleans of yaml.v2's resolve table that yaml.v3
// resolves as strings: the reference's metadata has them as booleans.
var yaml11Bools = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
}

func (c *metadataConverter) scalar(n *yaml.Node) (*structpb.Value, error) {
	switch n.ShortTag() {
	case "!!null":
		return structpb.NewNullValue(), nil
	case "!!bool":
		var b bool
		if err := n.Decode(&b); err == nil {
			return structpb.NewBoolValue(b), nil
		}
	case "!!int", "!!float":
		var f float64
		if err := n.Decode(&f); err == nil {
			if math.IsNaN(f) || math.IsInf(f, 0) {
				return nil, c.p.errorf(n.Line, "metadata value %s is not a number an answer can carry (JSON has no NaN or infinity)", describe(n))
			}
			return structpb.NewNumberValue(f), nil
		}
	case "!!str":
		if n.Style == 0 { // plain: neither quoted, nor a block, nor tagged
			if b, ok := yaml11Bools[n.Value]; ok {
				return structpb.NewBoolValue(b), nil
			}
		}
	}
	// Always valid UTF-8, as a protobuf string must be: yaml.v3 refuses
	// input that is not, and escapes that would make it.
	return structpb.NewStringValue(n.Value), nil
}
