package xdsconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	"github.com/slidingwindow/ratelimit/internal/config"
)

// envoyGatewayDir holds every config Envoy Gateway's translator renders in
// its tests, shared with internal/config (its source in the README there).
var envoyGatewayDir = filepath.Join("..", "config", "testdata", "envoygateway")

// TestEnvoyGatewayConfigs: every config Envoy Gateway's translator renders
// in its tests, as the RateLimitConfig resources it serves, builds into a
// config with one rule per rate_limit.
func TestEnvoyGatewayConfigs(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(envoyGatewayDir, "*.yaml"))
	if err != nil || len(files) != 25 {
		t.Fatalf("%d files in %s, want the 25 copied: %v", len(files), envoyGatewayDir, err)
	}
	resources := 0
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			rcs, limits := envoyGatewayResources(t, file)
			resources += len(rcs)
			res := make([]*anypb.Any, len(rcs))
			for i, rc := range rcs {
				a, err := anypb.New(rc)
				if err != nil {
					t.Fatal(err)
				}
				res[i] = a
			}
			c, err := Build(res, config.Defaults{})
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Rules()) != limits {
				t.Errorf("%d rules, want %d, one per rate_limit", len(c.Rules()), limits)
			}
		})
	}
	if resources != 32 {
		t.Errorf("%d resources in %d files, want 32", resources, len(files))
	}
}

// envoyGatewayResources reads the RateLimitConfig resources of one fixture,
// one per YAML document, and counts their rate limits. The rendering holds
// two fields of the reference's YAML that the proto lacks,
// value_to_metric and share_threshold: they must be false, and are dropped.
func envoyGatewayResources(t *testing.T, file string) ([]*rlsconfv3.RateLimitConfig, int) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []*rlsconfv3.RateLimitConfig
	limits := 0
	var drop func(v any)
	drop = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for _, k := range []string{"value_to_metric", "share_threshold"} {
				if b, ok := v[k]; ok {
					if b != false {
						t.Fatalf("%s: %s is %v", file, k, b)
					}
					delete(v, k)
				}
			}
			if rl, ok := v["rate_limit"]; ok && rl != nil {
				limits++
			}
			for _, e := range v {
				drop(e)
			}
		case []any:
			for _, e := range v {
				drop(e)
			}
		}
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		drop(doc)
		js, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		rc := &rlsconfv3.RateLimitConfig{}
		if err := protojson.Unmarshal(js, rc); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if !strings.Contains(string(data), "domain: "+rc.GetDomain()) {
			t.Fatalf("%s: domain %q lost", file, rc.GetDomain())
		}
		out = append(out, rc)
	}
	return out, limits
}
