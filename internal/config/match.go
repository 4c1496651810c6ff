package config

import "strings"

// Entry is what a request descriptor's entry offers; Envoy's generated
// *RateLimitDescriptor_Entry satisfies it, and so does BucketEntry, an RLQS
// bucket id's entry.
type Entry interface {
	GetKey() string
	GetValue() string
}

// Match returns the rule that applies to a request descriptor in domain, or
// nil. As in envoyproxy/ratelimit, each entry descends one level, preferring
// an exact value, then the first matching wildcard, then the key-only node;
// the rule is the one on the node the last entry reaches. It does not
// allocate.
func Match[E Entry](c *Config, domain string, entries []E) *Rule {
	lvl := c.domains[domain]
	var n *node
	for _, e := range entries {
		if lvl == nil { // unknown domain, or more entries than the tree is deep
			return nil
		}
		if n = lvl.lookup(e.GetKey(), e.GetValue()); n == nil {
			return nil
		}
		lvl = n.children
	}
	if n == nil {
		return nil
	}
	return n.rule
}

// level is one level of a domain's tree, indexed by key.
type level map[string]*keyIndex

// keyIndex holds the nodes of one key at one level.
type keyIndex struct {
	exact     map[string]*node
	wildcards []wildcard // in file order: the first match wins
	keyOnly   *node
}

// wildcard is a node whose value is a pattern with '*'.
type wildcard struct {
	parts []string // the pattern split at each '*'
	node  *node
}

// node is a descriptor of the configuration.
type node struct {
	rule     *Rule // nil when the descriptor has no rate_limit
	children level // nil when it has no descriptors
}

func (l level) add(lv Level, n *node) {
	ki := l[lv.Key]
	if ki == nil {
		ki = &keyIndex{}
		l[lv.Key] = ki
	}
	switch {
	case lv.Value == "":
		ki.keyOnly = n
	case lv.Wildcard:
		ki.wildcards = append(ki.wildcards, wildcard{strings.Split(lv.Value, "*"), n})
	default:
		if ki.exact == nil {
			ki.exact = make(map[string]*node)
		}
		ki.exact[lv.Value] = n
	}
}

func (l level) lookup(key, value string) *node {
	ki := l[key]
	if ki == nil {
		return nil
	}
	if n := ki.exact[value]; n != nil {
		return n
	}
	for _, w := range ki.wildcards {
		if globMatch(w.parts, value) {
			return w.node
		}
	}
	return ki.keyOnly
}

// globMatch reports whether s matches the pattern whose parts between '*'
// are parts (at least two). Taking each middle part at its leftmost place
// is enough, since '*' matches any run of bytes.
func globMatch(parts []string, s string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(s) < len(first)+len(last) || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	s = s[len(first) : len(s)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return true
}
