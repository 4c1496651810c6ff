package xdsconfig

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// TypeURL is the type of the resources the client subscribes to.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// DocumentPrefix starts the name under which a resource appears in messages,
// config.Config.Files and rule sources: "xds/" followed by the resource name.
const DocumentPrefix = "xds/"

// Build turns one state-of-the-world set of RateLimitConfig resources into a
// config, through the parser the files go through: every resource becomes
// the YAML document a config file would hold, with the proto's field names
// (those of the file format), and the documents are parsed in resource name
// order, so the same set always gives the same config and hash. A field the
// file format does not accept is refused as it would be in a file.
func Build(resources []*anypb.Any, d config.Defaults) (*config.Config, error) {
	docs := make([]config.Document, 0, len(resources))
	seen := make(map[string]bool, len(resources))
	for i, res := range resources {
		if res.GetTypeUrl() != TypeURL {
			return nil, fmt.Errorf("resource %d: type %q, want %q", i, res.GetTypeUrl(), TypeURL)
		}
		var rc rlsconfv3.RateLimitConfig
		if err := res.UnmarshalTo(&rc); err != nil {
			return nil, fmt.Errorf("resource %d: %w", i, err)
		}
		name := rc.GetName()
		if name == "" {
			return nil, fmt.Errorf("resource %d (domain %q): the name is empty", i, rc.GetDomain())
		}
		if seen[name] {
			return nil, fmt.Errorf("two resources are named %q", name)
		}
		seen[name] = true
		data, err := document(&rc)
		if err != nil {
			return nil, fmt.Errorf("%s%s: %w", DocumentPrefix, name, err)
		}
		docs = append(docs, config.Document{Name: DocumentPrefix + name, Data: data})
	}
	slices.SortFunc(docs, func(a, b config.Document) int { return cmp.Compare(a.Name, b.Name) })
	return config.ParseDocuments(docs, d)
}

// document renders a RateLimitConfig as the YAML of a config file: its set
// fields in the order the proto declares them, the resource's own name left
// out (it names the document), units as the lower-case words the files use,
// and metadata as a mapping. A rate_limit that is not unlimited always
// states requests_per_unit: proto3 does not tell an unset 0 from a set one,
// and for the reference both mean 0.
func document(rc *rlsconfv3.RateLimitConfig) ([]byte, error) {
	root, err := messageNode(rc.ProtoReflect())
	if err != nil {
		return nil, err
	}
	// The name is the resource's, not a field of the file format.
	for i := 0; i < len(root.Content); i += 2 {
		if root.Content[i].Value == "name" {
			root.Content = slices.Delete(root.Content, i, i+2)
			break
		}
	}
	mergeSiblingLimits(root)
	return yaml.Marshal(root)
}

// mergeSiblingLimits turns sibling descriptors with one key and value, each
// with a rate_limit and otherwise alike, into one descriptor with
// rate_limits: a RateLimitConfig carries one rate_limit per descriptor, so
// several limits on one descriptor (10 per second and 1000 per day) come as
// such siblings. Their children join. Siblings that differ in anything else
// stay apart, and the parser refuses them as duplicates, as a file's.
func mergeSiblingLimits(n *yaml.Node) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Kind == yaml.MappingNode && n.Content[i].Value == "descriptors" && n.Content[i+1].Kind == yaml.SequenceNode {
			n.Content[i+1].Content = mergeSiblings(n.Content[i+1].Content)
		}
	}
	for _, c := range n.Content {
		mergeSiblingLimits(c)
	}
}

func mergeSiblings(descriptors []*yaml.Node) []*yaml.Node {
	var out []*yaml.Node
	for _, d := range descriptors {
		i := slices.IndexFunc(out, func(o *yaml.Node) bool { return sameButLimits(o, d) })
		if i < 0 {
			out = append(out, d)
			continue
		}
		m := out[i]
		limits := field(m, "rate_limits")
		if limits == nil {
			limits = &yaml.Node{Kind: yaml.SequenceNode, Content: []*yaml.Node{field(m, "rate_limit")}}
			setField(m, "rate_limit", nil)
			setField(m, "rate_limits", limits)
		}
		limits.Content = append(limits.Content, field(d, "rate_limit"))
		if children := field(d, "descriptors"); children != nil {
			if mine := field(m, "descriptors"); mine != nil {
				mine.Content = append(mine.Content, children.Content...)
			} else {
				setField(m, "descriptors", children)
			}
		}
	}
	return out
}

// sameButLimits reports two descriptors with a rate_limit (a limits list for
// one already merged) whose other fields, children aside, are equal.
func sameButLimits(a, b *yaml.Node) bool {
	if field(a, "rate_limit") == nil && field(a, "rate_limits") == nil || field(b, "rate_limit") == nil {
		return false
	}
	other := func(n *yaml.Node) map[string]string {
		m := map[string]string{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			switch k := n.Content[i].Value; k {
			case "rate_limit", "rate_limits", "descriptors":
			default:
				v, _ := yaml.Marshal(n.Content[i+1])
				m[k] = string(v)
			}
		}
		return m
	}
	return maps.Equal(other(a), other(b))
}

// field is the value of key in mapping n, or nil.
func field(n *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// setField sets key in mapping n to v, or removes it when v is nil.
func setField(n *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			if v == nil {
				n.Content = slices.Delete(n.Content, i, i+2)
			} else {
				n.Content[i+1] = v
			}
			return
		}
	}
	if v != nil {
		n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
	}
}

var policyName = (&rlsconfv3.RateLimitPolicy{}).ProtoReflect().Descriptor().FullName()

func messageNode(m protoreflect.Message) (*yaml.Node, error) {
	n := &yaml.Node{Kind: yaml.MappingNode}
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if !m.Has(fd) && (m.Descriptor().FullName() != policyName || fd.Name() != "requests_per_unit" || unlimited(m)) {
			continue
		}
		v, err := valueNode(fd, m.Get(fd))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fd.Name(), err)
		}
		n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: string(fd.Name())}, v)
	}
	return n, nil
}

func unlimited(policy protoreflect.Message) bool {
	return policy.Get(policy.Descriptor().Fields().ByName("unlimited")).Bool()
}

func valueNode(fd protoreflect.FieldDescriptor, v protoreflect.Value) (*yaml.Node, error) {
	if !fd.IsList() {
		return singularNode(fd, v)
	}
	l := v.List()
	n := &yaml.Node{Kind: yaml.SequenceNode}
	for i := 0; i < l.Len(); i++ {
		e, err := singularNode(fd, l.Get(i))
		if err != nil {
			return nil, err
		}
		n.Content = append(n.Content, e)
	}
	return n, nil
}

func singularNode(fd protoreflect.FieldDescriptor, v protoreflect.Value) (*yaml.Node, error) {
	scalar := func(tag, value string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: value} }
	switch fd.Kind() {
	case protoreflect.MessageKind:
		if s, ok := v.Message().Interface().(*structpb.Struct); ok {
			var n yaml.Node
			if err := n.Encode(s.AsMap()); err != nil {
				return nil, err
			}
			plainKeys(&n)
			return &n, nil
		}
		return messageNode(v.Message())
	case protoreflect.EnumKind:
		ev := fd.Enum().Values().ByNumber(v.Enum())
		if ev == nil {
			return nil, fmt.Errorf("unknown value %d", v.Enum())
		}
		return scalar("!!str", strings.ToLower(string(ev.Name()))), nil
	case protoreflect.StringKind:
		return scalar("!!str", v.String()), nil
	case protoreflect.BoolKind:
		return scalar("!!bool", strconv.FormatBool(v.Bool())), nil
	case protoreflect.Uint32Kind, protoreflect.Uint64Kind, protoreflect.Fixed32Kind, protoreflect.Fixed64Kind:
		return scalar("!!int", strconv.FormatUint(v.Uint(), 10)), nil
	case protoreflect.Int32Kind, protoreflect.Int64Kind, protoreflect.Sint32Kind, protoreflect.Sint64Kind,
		protoreflect.Sfixed32Kind, protoreflect.Sfixed64Kind:
		return scalar("!!int", strconv.FormatInt(v.Int(), 10)), nil
	}
	return nil, fmt.Errorf("field kind %v has no place in a config file", fd.Kind())
}

// plainKeys makes every key of the mappings in n a string the parser reads
// back as such. The encoder leaves a "<<" key a merge key (!!merge), which
// would merge its value away or be refused: a Struct's keys are all plain
// strings, so the metadata the parser reads back is the Struct sent.
func plainKeys(n *yaml.Node) {
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k := n.Content[i]; k.ShortTag() != "!!str" {
				k.Tag, k.Style = "!!str", yaml.DoubleQuotedStyle
			}
		}
	}
	for _, c := range n.Content {
		plainKeys(c)
	}
}
