package deploy

import (
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// TestBudgetsDocTokenBudget: docs/budgets.md's two-phase snippets are Envoy
// config, and are the /llm route's and the header_to_metadata filter of
// envoy.yaml.
func TestBudgetsDocTokenBudget(t *testing.T) {
	const doc = "../docs/budgets.md"
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)
	action := &routev3.RouteAction{}
	if err := unmarshalEnvoy([]byte(fencedBlock(t, doc, "# the route's action: rate_limits")), action); err != nil {
		t.Fatalf("%s: rate_limits: %v", doc, err)
	}
	llm := e.vhost.GetRoutes()[slices.IndexFunc(e.vhost.GetRoutes(), func(r *routev3.Route) bool { return r.GetName() == "llm" })]
	want := llm.GetRoute().GetRateLimits()
	got := action.GetRateLimits()
	if len(got) != 2 || len(want) < 2 || !proto.Equal(got[0], want[0]) || !proto.Equal(got[1], want[1]) {
		t.Errorf("%s: rate_limits %v, want the first two of %s's llm route: %v", doc, got, envoyFile, want)
	}
	filter := &hcmv3.HttpFilter{}
	if err := unmarshalEnvoy([]byte(fencedBlock(t, doc, "# an http_filters entry, before envoy.filters.http.ratelimit")), filter); err != nil {
		t.Fatalf("%s: http filter: %v", doc, err)
	}
	check := &schemaCheck{}
	check.validate(filter, "http_filters")
	for _, err := range check.errs {
		t.Errorf("%s: %v", doc, err)
	}
	i := slices.IndexFunc(e.hcm.GetHttpFilters(), func(f *hcmv3.HttpFilter) bool { return f.GetName() == filter.GetName() })
	if i < 0 || !proto.Equal(e.hcm.GetHttpFilters()[i], filter) {
		t.Errorf("%s: the header_to_metadata filter differs from %s's", doc, envoyFile)
	}
	if r := slices.Index(e.filterNames, "envoy.filters.http.ratelimit"); i < 0 || i > r {
		t.Errorf("%s: header_to_metadata must come before the rate limit filter: %v", envoyFile, e.filterNames)
	}
}

// TestBudgetsDocConcurrencyLimit: docs/budgets.md's concurrency limit is the
// /concurrency route's first two rate_limits entries of envoy.yaml, and its
// rule is config/'s concurrent_per_user.
func TestBudgetsDocConcurrencyLimit(t *testing.T) {
	const doc = "../docs/budgets.md"
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)
	action := &routev3.RouteAction{}
	if err := unmarshalEnvoy([]byte(fencedBlock(t, doc, "# the route's action: rate_limits of a concurrency limit")), action); err != nil {
		t.Fatalf("%s: rate_limits: %v", doc, err)
	}
	i := slices.IndexFunc(e.vhost.GetRoutes(), func(r *routev3.Route) bool { return r.GetName() == "concurrency" })
	if i < 0 {
		t.Fatalf("%s has no concurrency route", envoyFile)
	}
	want := e.vhost.GetRoutes()[i].GetRoute().GetRateLimits()
	got := action.GetRateLimits()
	if len(got) != 2 || len(want) < 2 || !proto.Equal(got[0], want[0]) || !proto.Equal(got[1], want[1]) {
		t.Errorf("%s: rate_limits %v, want the first two of %s's concurrency route: %v", doc, got, envoyFile, want)
	}
	rule := "domain: edge\ndescriptors:\n" + fencedBlock(t, doc, "- key: concurrent_user")
	cfg, err := config.Parse("budgets.md", []byte(rule), config.Defaults{})
	if err != nil {
		t.Fatalf("%s: the rule: %v", doc, err)
	}
	got1, want1 := cfg.Rules()[0], ruleNamed(t, loadRules(t), "concurrent_per_user")
	if got1.RequestsPerUnit != want1.RequestsPerUnit || got1.Window() != want1.Window() || got1.Algorithm != want1.Algorithm ||
		got1.RecordCosts != want1.RecordCosts || got1.Leases != want1.Leases || got1.LeaseTTL != want1.LeaseTTL {
		t.Errorf("%s: rule %v, want %s's concurrent_per_user: %v", doc, got1, rulesDir, want1)
	}
}

// TestBudgetsDocReservedTokenBudget: docs/budgets.md's reserved token
// budget is a valid route action whose stream-done entry takes the lease id
// as the /concurrency route does, and its rule a valid rule with leases.
func TestBudgetsDocReservedTokenBudget(t *testing.T) {
	const doc = "../docs/budgets.md"
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)
	i := slices.IndexFunc(e.vhost.GetRoutes(), func(r *routev3.Route) bool { return r.GetName() == "concurrency" })
	release := e.vhost.GetRoutes()[i].GetRoute().GetRateLimits()[1].GetActions()[1]
	budget := &routev3.RouteAction{}
	if err := unmarshalEnvoy([]byte(fencedBlock(t, doc, "# the route's action: rate_limits of a reserved token budget")), budget); err != nil {
		t.Fatalf("%s: reserved token budget: %v", doc, err)
	}
	rls := budget.GetRateLimits()
	if len(rls) != 2 || !rls[1].GetApplyOnStreamDone() || len(rls[1].GetActions()) != 2 {
		t.Fatalf("%s: reserved token budget %v, want a reservation and a settlement with a lease id", doc, rls)
	}
	got := rls[1].GetActions()[1].GetMetadata()
	want := proto.Clone(release.GetMetadata()).(*routev3.RateLimit_Action_MetaData)
	want.GetMetadataKey().GetPath()[1].Segment = got.GetMetadataKey().GetPath()[1].Segment // the rule's name differs
	if !proto.Equal(got, want) {
		t.Errorf("%s: the settlement's metadata action %v, want the /concurrency route's %v but for the rule's name", doc, got, want)
	}
	cfg, err := config.Parse("budgets.md", []byte("domain: edge\ndescriptors:\n"+fencedBlock(t, doc, "# the reserved token budget's rule")), config.Defaults{})
	if err != nil || !cfg.Rules()[0].Leases || cfg.Rules()[0].Name != got.GetMetadataKey().GetPath()[1].GetKey() {
		t.Errorf("%s: the token budget's rule: %v, want leases, named as the metadata path says", doc, err)
	}
}

// TestReadmeEnvoySnippet: the README's Envoy blocks are envoy.yaml's rate
// limit filter, the service's cluster and the default route's rate_limits,
// field for field, so the front page shows what deploy_test.go checks.
func TestReadmeEnvoySnippet(t *testing.T) {
	const doc = "../README.md"
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)

	filter := &hcmv3.HttpFilter{}
	filterBlock := fencedBlock(t, doc, "# the rate limit filter: an http_filters entry, before envoy.filters.http.router")
	if err := unmarshalEnvoy([]byte(filterBlock), filter); err != nil {
		t.Fatalf("%s: rate limit filter: %v", doc, err)
	}
	check := &schemaCheck{}
	check.validate(filter, "http_filters")
	for _, err := range check.errs {
		t.Errorf("%s: %v", doc, err)
	}
	i := slices.IndexFunc(e.hcm.GetHttpFilters(), func(f *hcmv3.HttpFilter) bool { return f.GetName() == "envoy.filters.http.ratelimit" })
	if i < 0 || !proto.Equal(e.hcm.GetHttpFilters()[i], filter) {
		t.Errorf("%s: the rate limit filter differs from %s's", doc, envoyFile)
	}

	cluster := &clusterv3.Cluster{}
	if err := unmarshalEnvoy([]byte(fencedBlock(t, doc, "# the service's cluster: gRPC, so HTTP/2")), cluster); err != nil {
		t.Fatalf("%s: cluster: %v", doc, err)
	}
	check = &schemaCheck{}
	check.validate(cluster, "clusters")
	for _, err := range check.errs {
		t.Errorf("%s: %v", doc, err)
	}
	name := e.filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	if want := e.clusters[name]; want == nil || !proto.Equal(cluster, want) {
		t.Errorf("%s: cluster %v differs from %s's %q cluster", doc, cluster, envoyFile, name)
	}

	action := &routev3.RouteAction{}
	actionBlock := fencedBlock(t, doc, "# a route's action: one descriptor per client address, [remote_address=<client ip>]")
	if err := unmarshalEnvoy([]byte(actionBlock), action); err != nil {
		t.Fatalf("%s: rate_limits: %v", doc, err)
	}
	j := slices.IndexFunc(e.vhost.GetRoutes(), func(r *routev3.Route) bool { return r.GetName() == "default" })
	if j < 0 {
		t.Fatalf("%s has no default route", envoyFile)
	}
	want := e.vhost.GetRoutes()[j].GetRoute().GetRateLimits()
	if got := action.GetRateLimits(); len(want) == 0 || !slices.EqualFunc(got, want, func(a, b *routev3.RateLimit) bool { return proto.Equal(a, b) }) {
		t.Errorf("%s: rate_limits %v, want %s's default route's: %v", doc, got, envoyFile, want)
	}
}

func docsCentralCluster(t *testing.T) *clusterv3.Cluster {
	t.Helper()
	c := &clusterv3.Cluster{}
	if err := unmarshalEnvoy([]byte(docsBlock(t, "# envoy cluster: central")), c); err != nil {
		t.Fatalf("%s: central cluster: %v", deployDocFile, err)
	}
	return c
}

func TestDocsCentralCluster(t *testing.T) {
	c := docsCentralCluster(t)
	check := &schemaCheck{}
	check.validate(c, "cluster")
	for _, err := range check.errs {
		t.Errorf("%s: central cluster: %v", deployDocFile, err)
	}
	b, _ := loadBootstrap(t)
	e := newEdge(t, b)
	sidecar := e.clusters[e.filter.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()]
	if c.GetName() != sidecar.GetName() {
		t.Errorf("central cluster is named %q, want %q as in %s", c.GetName(), sidecar.GetName(), envoyFile)
	}
	const hpo = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
	if !proto.Equal(c.GetTypedExtensionProtocolOptions()[hpo], sidecar.GetTypedExtensionProtocolOptions()[hpo]) {
		t.Error("central cluster's HttpProtocolOptions differ from the sidecar's (HTTP/2)")
	}
	if c.GetType() != clusterv3.Cluster_STRICT_DNS {
		t.Errorf("central cluster type %v, want STRICT_DNS on the headless Service, one host per pod", c.GetType())
	}
	hc := c.GetHealthChecks()
	if len(hc) != 1 || hc[0].GetGrpcHealthCheck().GetServiceName() != rlsv3.RateLimitService_ServiceDesc.ServiceName {
		t.Errorf("central cluster health_checks %v, want one gRPC health check of %s", hc, rlsv3.RateLimitService_ServiceDesc.ServiceName)
	}
}

// docsBlock returns the fenced code block of docs/deploy.md whose first line
// is marker.
func docsBlock(t *testing.T, marker string) string {
	t.Helper()
	return fencedBlock(t, deployDocFile, marker)
}

// fencedBlock returns the fenced yaml code block of file whose first line is
// marker.
func fencedBlock(t *testing.T, file, marker string) string {
	t.Helper()
	var found []string
	var block []string // lines of the yaml block being read, its fence's indentation removed
	indent, in := "", false
	for _, line := range strings.Split(string(readFile(t, file)), "\n") {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case !in && strings.HasPrefix(trimmed, "```"):
			in, block = true, nil
			indent = line[:len(line)-len(trimmed)]
			if strings.TrimSpace(strings.TrimPrefix(trimmed, "```")) != "yaml" {
				block = nil
				indent = "\x00" // not yaml: skip to the closing fence
			}
		case in && strings.HasPrefix(trimmed, "```"):
			in = false
			if len(block) > 0 && block[0] == marker {
				found = append(found, strings.Join(block, "\n")+"\n")
			}
		case in && indent != "\x00":
			block = append(block, strings.TrimPrefix(line, indent))
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: %d yaml blocks start with %q, want 1", file, len(found), marker)
	}
	return found[0]
}
