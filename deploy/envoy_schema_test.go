package deploy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	// Every type a typed_config of envoy.yaml (or of the docs' snippets) names
	// must be registered for protojson to resolve its "@type".
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
)

// ---------------------------------------------------------------------------
// Parsing and validating with Envoy's protos.

// unmarshalEnvoy reads Envoy YAML into m as Envoy does: YAML to JSON, then
// the proto JSON mapping, unknown fields refused.
func unmarshalEnvoy(data []byte, m proto.Message) error {
	j, err := yaml.YAMLToJSONStrict(data) // duplicate keys are an error
	if err != nil {
		return err
	}
	return protojson.UnmarshalOptions{DiscardUnknown: false}.Unmarshal(j, m)
}

// schemaCheck collects what validating a message tree finds.
type schemaCheck struct {
	types []string // type URLs of every Any unpacked, in walk order
	errs  []error
}

// validate runs protoc-gen-validate's ValidateAll on m, then walks it: every
// google.protobuf.Any (typed_config, typed_extension_protocol_options, ...)
// is unpacked with the registered types and validated in turn, which the
// outer ValidateAll does not do. Fields and enum values marked deprecated are
// reported too: Envoy warns about them, and refuses some by default.
func (c *schemaCheck) validate(m proto.Message, path string) {
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			c.errs = append(c.errs, fmt.Errorf("%s (%s): %w", path, m.ProtoReflect().Descriptor().FullName(), err))
		}
	} else {
		c.errs = append(c.errs, fmt.Errorf("%s: %s has no ValidateAll", path, m.ProtoReflect().Descriptor().FullName()))
	}
	c.walk(m.ProtoReflect(), path)
}

func (c *schemaCheck) walk(m protoreflect.Message, path string) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		if opts, ok := fd.Options().(*descriptorpb.FieldOptions); ok && opts.GetDeprecated() {
			c.errs = append(c.errs, fmt.Errorf("%s: deprecated field", p))
		}
		switch {
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				c.value(fd, l.Get(i), fmt.Sprintf("%s[%d]", p, i))
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				c.value(fd.MapValue(), mv, fmt.Sprintf("%s[%v]", p, k))
				return true
			})
		default:
			c.value(fd, v, p)
		}
		return true
	})
}

func (c *schemaCheck) value(fd protoreflect.FieldDescriptor, v protoreflect.Value, path string) {
	switch fd.Kind() {
	case protoreflect.EnumKind:
		ev := fd.Enum().Values().ByNumber(v.Enum())
		if ev == nil {
			c.errs = append(c.errs, fmt.Errorf("%s: unknown enum number %d", path, v.Enum()))
		} else if opts, ok := ev.Options().(*descriptorpb.EnumValueOptions); ok && opts.GetDeprecated() {
			c.errs = append(c.errs, fmt.Errorf("%s: deprecated enum value %s", path, ev.Name()))
		}
	case protoreflect.MessageKind, protoreflect.GroupKind:
		msg := v.Message()
		a, ok := msg.Interface().(*anypb.Any)
		if !ok {
			c.walk(msg, path)
			return
		}
		// A route's FilterConfig with an empty config enables a filter that
		// http_filters disables, with no config of its own: Envoy reads no type.
		if a.GetTypeUrl() == "" && len(a.GetValue()) == 0 && fd.FullName() == "envoy.config.route.v3.FilterConfig.config" {
			return
		}
		inner, err := a.UnmarshalNew() // resolved in protoregistry.GlobalTypes
		if err != nil {
			c.errs = append(c.errs, fmt.Errorf("%s: %s: %w (blank-import its package)", path, a.GetTypeUrl(), err))
			return
		}
		c.types = append(c.types, a.GetTypeUrl())
		c.validate(inner, path+"<"+string(inner.ProtoReflect().Descriptor().FullName())+">")
	}
}

// loadBootstrap parses and fully validates envoy.yaml.
func loadBootstrap(t *testing.T) (*bootstrapv3.Bootstrap, *schemaCheck) {
	t.Helper()
	b := &bootstrapv3.Bootstrap{}
	if err := unmarshalEnvoy(readFile(t, envoyFile), b); err != nil {
		t.Fatalf("%s: %v", envoyFile, err)
	}
	c := &schemaCheck{}
	c.validate(b, "bootstrap")
	for _, err := range c.errs {
		t.Errorf("%s: %v", envoyFile, err)
	}
	if len(c.errs) > 0 {
		t.FailNow()
	}
	return b, c
}

func TestEnvoyBootstrapSchema(t *testing.T) {
	b, check := loadBootstrap(t)

	// Every typed_config was unpacked and validated.
	want := []string{
		"type.googleapis.com/envoy.config.route.v3.FilterConfig",
		"type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
		"type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config",
		"type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings",
		"type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig",
		"type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
		"type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
		"type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
		"type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
		"type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput",
	}
	got := slices.Compact(slices.Sorted(slices.Values(check.types)))
	if !slices.Equal(got, want) {
		t.Errorf("typed_config types:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}

	// The validation reaches inside typed_config: a bad value there fails.
	broken := strings.Replace(string(readFile(t, envoyFile)), "cluster_name: ratelimit", `cluster_name: ""`, 1)
	bb := &bootstrapv3.Bootstrap{}
	if err := unmarshalEnvoy([]byte(broken), bb); err != nil {
		t.Fatal(err)
	}
	if bb.ValidateAll() != nil {
		t.Error("the outer ValidateAll reached into a typed_config: the Any walk is no longer needed")
	}
	bc := &schemaCheck{}
	bc.validate(bb, "bootstrap")
	if len(bc.errs) == 0 || !strings.Contains(errors.Join(bc.errs...).Error(), "ClusterName") {
		t.Errorf("an empty envoy_grpc.cluster_name inside the filter's typed_config passed validation: %v", bc.errs)
	}
	// And an unknown field is refused, as Envoy refuses it.
	misspelt := strings.Replace(string(readFile(t, envoyFile)), "domain: edge", "domain: edge\n                      domian: edge", 1)
	if err := unmarshalEnvoy([]byte(misspelt), &bootstrapv3.Bootstrap{}); err == nil {
		t.Error("an unknown field inside a typed_config was accepted")
	}

	e := newEdge(t, b)
	cfg := loadRules(t)
	f := e.filter

	t.Run("filter", func(t *testing.T) {
		if !cfg.HasDomain(f.GetDomain()) {
			t.Errorf("filter domain %q is not a domain of %s", f.GetDomain(), rulesDir)
		}
		for _, r := range cfg.Rules() {
			if r.Domain != f.GetDomain() {
				t.Errorf("rule %s: domain %q is not the filter's %q: nothing sends to it", r, r.Domain, f.GetDomain())
			}
		}
		// The service takes its deadline from Envoy's (grpc-timeout) and
		// answers by the rule's failure_mode before it, which needs a Redis
		// round trip and the answer's margin; past 100 ms a slow Redis would
		// hold every request that long.
		if timeout := f.GetTimeout().AsDuration(); timeout < 10*time.Millisecond || timeout > 100*time.Millisecond {
			t.Errorf("timeout %v: want between 10ms and 100ms", timeout)
		}
		if f.GetFailureModeDeny() {
			t.Error("failure_mode_deny: true; the documented choice is to fail open when the service is unreachable")
		}
		if f.GetEnableXRatelimitHeaders() != ratelimitv3.RateLimit_DRAFT_VERSION_03 {
			t.Errorf("enable_x_ratelimit_headers = %v", f.GetEnableXRatelimitHeaders())
		}
		if !f.GetRateLimitedAsResourceExhausted() {
			t.Error("rate_limited_as_resource_exhausted is off")
		}
		rls := f.GetRateLimitService()
		if rls.GetTransportApiVersion() != corev3.ApiVersion_V3 {
			t.Errorf("transport_api_version = %v", rls.GetTransportApiVersion())
		}
		name := rls.GetGrpcService().GetEnvoyGrpc().GetClusterName()
		c := e.clusters[name]
		if c == nil {
			t.Fatalf("rate_limit_service cluster %q is not defined", name)
		}
		opts := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
		if opts == nil {
			t.Fatalf("cluster %s: no HttpProtocolOptions: gRPC needs HTTP/2", name)
		}
		hpo := unpack(t, opts, &upstreamhttpv3.HttpProtocolOptions{})
		if hpo.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Errorf("cluster %s: not explicit HTTP/2", name)
		}
	})

	t.Run("filter chain", func(t *testing.T) {
		names := e.filterNames
		if len(names) < 2 || names[len(names)-1] != "envoy.filters.http.router" {
			t.Errorf("http_filters %v: the router must be last", names)
		}
		if i := slices.Index(names, "envoy.filters.http.ratelimit"); i < 0 || i > len(names)-2 {
			t.Errorf("http_filters %v: envoy.filters.http.ratelimit must come before the router", names)
		}
	})

	t.Run("routes and clusters", func(t *testing.T) {
		for _, rt := range e.vhost.GetRoutes() {
			if rt.GetName() == "" {
				t.Error("a route has no name")
			}
			if c := rt.GetRoute().GetCluster(); e.clusters[c] == nil {
				t.Errorf("route %s: cluster %q is not defined", rt.GetName(), c)
			}
		}
		// The last route catches everything, so nothing escapes the
		// per-address limit by matching no route.
		routes := e.vhost.GetRoutes()
		if m := routes[len(routes)-1].GetMatch(); m.GetPrefix() != "/" {
			t.Errorf("last route matches %v, want prefix /", m)
		}
		if a := e.admin; a.GetAddress() != "127.0.0.1" {
			t.Errorf("admin listens on %q: keep it on loopback", a.GetAddress())
		}
	})
}
