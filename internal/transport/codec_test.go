package transport

import (
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/slidingwindow/ratelimit/internal/config"
	"github.com/slidingwindow/ratelimit/internal/service"
)

func testCodec(maxDescriptors, maxEntries int) encoding.CodecV2 {
	return NewCodec(maxDescriptors, maxEntries)
}

func decode(t *testing.T, c encoding.CodecV2, wire []byte) *rlsv3.RateLimitRequest {
	t.Helper()
	var req rlsv3.RateLimitRequest
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, &req); err != nil {
		t.Fatalf("Unmarshal: %v", err)
	}
	return &req
}

// TestCodecDecodesAsProto: for valid UTF-8, the codec decodes exactly what
// the standard decoder does, every field included (costs, overrides,
// negative hits, unknown fields), and repeated or reordered fields merge as
// proto's rules say.
func TestCodecDecodesAsProto(t *testing.T) {
	full := &rlsv3.RateLimitRequest{
		Domain:     "edge",
		HitsAddend: 7,
		Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}, {Key: "path", Value: "/ü"}}},
			{},
			{
				Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "k"}},
				Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{
					RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_HOUR, UnitMultiplier: wrapperspb.UInt32(2),
				},
				HitsAddend:     wrapperspb.UInt64(9),
				IsNegativeHits: true,
			},
		},
	}
	wire, err := proto.Marshal(full)
	if err != nil {
		t.Fatal(err)
	}
	// An unknown field (number 99) in each message, and a second domain
	// field: the last one wins.
	unknown := protowire.AppendTag(nil, 99, protowire.VarintType)
	unknown = protowire.AppendVarint(unknown, 5)
	withExtra := append(append([]byte{}, wire...), unknown...)
	withExtra = protowire.AppendTag(withExtra, requestDomain, protowire.BytesType)
	withExtra = protowire.AppendString(withExtra, "edge2")
	entry := protowire.AppendTag(nil, entryValue, protowire.BytesType)
	entry = protowire.AppendString(entry, "v")
	entry = append(entry, unknown...)
	desc := protowire.AppendTag(nil, descriptorEntries, protowire.BytesType)
	desc = protowire.AppendBytes(desc, entry)
	desc = append(desc, unknown...)
	withExtra = protowire.AppendTag(withExtra, requestDescriptors, protowire.BytesType)
	withExtra = protowire.AppendBytes(withExtra, desc)

	for name, in := range map[string][]byte{"marshaled": wire, "extra fields": withExtra} {
		var want rlsv3.RateLimitRequest
		if err := proto.Unmarshal(in, &want); err != nil {
			t.Fatal(err)
		}
		got := decode(t, testCodec(64, 32), in)
		if !proto.Equal(got, &want) {
			t.Fatalf("%s: decoded\n%v\nwant\n%v", name, got, &want)
		}
	}
}

// TestCodecKeepsAnyBytes: values, keys and the domain that are not UTF-8
// are kept byte for byte, where the standard decoder refuses the message.
func TestCodecKeepsAnyBytes(t *testing.T) {
	bad := "\xff\xfe" + strings.Repeat("\xc3", 3) + "ok"
	entry := protowire.AppendTag(nil, entryKey, protowire.BytesType)
	entry = protowire.AppendString(entry, "k"+bad)
	entry = protowire.AppendTag(entry, entryValue, protowire.BytesType)
	entry = protowire.AppendString(entry, bad)
	desc := protowire.AppendTag(nil, descriptorEntries, protowire.BytesType)
	desc = protowire.AppendBytes(desc, entry)
	wire := protowire.AppendTag(nil, requestDomain, protowire.BytesType)
	wire = protowire.AppendString(wire, "d"+bad)
	wire = protowire.AppendTag(wire, requestDescriptors, protowire.BytesType)
	wire = protowire.AppendBytes(wire, desc)

	if err := proto.Unmarshal(wire, &rlsv3.RateLimitRequest{}); err == nil {
		t.Fatal("the standard decoder took invalid UTF-8: this codec is not needed any more")
	}
	got := decode(t, testCodec(64, 32), wire)
	if got.Domain != "d"+bad || len(got.Descriptors) != 1 || len(got.Descriptors[0].Entries) != 1 ||
		got.Descriptors[0].Entries[0].Key != "k"+bad || got.Descriptors[0].Entries[0].Value != bad {
		t.Fatalf("decoded %q", got)
	}
}

// TestCodecStopsAtTheBounds: past --max-descriptors and --max-entries the
// codec keeps one more (so validation refuses the request) and allocates
// nothing for the rest: a message of 200,000 empty descriptors costs a few
// allocations, not 200,000.
func TestCodecStopsAtTheBounds(t *testing.T) {
	c := testCodec(4, 2)
	domain := protowire.AppendTag(nil, requestDomain, protowire.BytesType)
	domain = protowire.AppendString(domain, "svc")
	empties := append([]byte{}, domain...)
	for range 200_000 {
		empties = protowire.AppendTag(empties, requestDescriptors, protowire.BytesType)
		empties = protowire.AppendBytes(empties, nil)
	}
	if got := decode(t, c, empties); len(got.Descriptors) != 5 {
		t.Fatalf("%d descriptors decoded, want 5 (the bound and one)", len(got.Descriptors))
	}
	allocs := testing.AllocsPerRun(5, func() { decode(t, c, empties) })
	if allocs > 20 {
		t.Fatalf("%.0f allocations for 200,000 empty descriptors", allocs)
	}

	entry := protowire.AppendTag(nil, entryKey, protowire.BytesType)
	entry = protowire.AppendString(entry, "k")
	var desc []byte
	for range 1000 {
		desc = protowire.AppendTag(desc, descriptorEntries, protowire.BytesType)
		desc = protowire.AppendBytes(desc, entry)
	}
	wire := protowire.AppendTag(append([]byte{}, domain...), requestDescriptors, protowire.BytesType)
	wire = protowire.AppendBytes(wire, desc)
	if got := decode(t, c, wire); len(got.Descriptors[0].Entries) != 3 {
		t.Fatalf("%d entries decoded, want 3", len(got.Descriptors[0].Entries))
	}

	// The service's validation, on the same bounds, names them.
	s := service.New(mustConfig(), nil, &service.Options{MaxDescriptors: 4, MaxEntries: 2})
	if _, err := s.ShouldRateLimit(t.Context(), decode(t, c, empties)); status.Convert(err).Message() != "request has more than the limit of 4 descriptors" {
		t.Fatalf("validate: %v", err)
	}
	if _, err := s.ShouldRateLimit(t.Context(), decode(t, c, wire)); status.Convert(err).Message() != "descriptor 0 has more than the limit of 2 entries" {
		t.Fatalf("validate: %v", err)
	}
}

// TestCodecOtherMessages: every other message goes through the standard
// codec, both ways; malformed bytes are an error, not a panic.
func TestCodecOtherMessages(t *testing.T) {
	c := testCodec(64, 32)
	data, err := c.Marshal(&healthpb.HealthCheckRequest{Service: "x"})
	if err != nil {
		t.Fatal(err)
	}
	var got healthpb.HealthCheckRequest
	if err := c.Unmarshal(data, &got); err != nil || got.Service != "x" {
		t.Fatalf("health request: %v %v", &got, err)
	}
	for _, wire := range [][]byte{{0x12}, {0x12, 0x05, 0x0a}, {0x12, 0x02, 0x0a, 0x09}, {0xff}} {
		var req rlsv3.RateLimitRequest
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, &req); err == nil {
			t.Errorf("% x decoded without an error: %v", wire, &req)
		}
	}
}

func mustConfig() *config.Config {
	const testConfig = `
domain: svc
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 2}
`
	cfg, err := config.Parse("test.yaml", []byte(testConfig), config.Defaults{})
	if err != nil {
		panic(err)
	}
	return cfg
}
