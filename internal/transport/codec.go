package transport

import (
	"fmt"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Field numbers of the strings a client controls, from envoy's rls.proto
// and ratelimit.proto (go-control-plane's generated code).
const (
	requestDomain      = 1 // RateLimitRequest.domain
	requestDescriptors = 2 // RateLimitRequest.descriptors
	descriptorEntries  = 1 // RateLimitDescriptor.entries
	entryKey           = 1 // RateLimitDescriptor.Entry.key
	entryValue         = 2 // RateLimitDescriptor.Entry.value
)

// NewCodec returns the gRPC codec of the rate limit port (for
// grpc.ForceServerCodecV2, or grpcunary's Options.Codec). It decodes a
// RateLimitRequest without the UTF-8 check proto3 strings get: descriptor
// values are copied from client headers, and one byte that is not UTF-8
// must not fail the whole request (Envoy would then let it through
// unlimited). Domain, entry keys and values keep their bytes as they are;
// every other field goes through the standard proto decoder, so fields
// added to the protocol keep working. Every other message (health,
// reflection) and every answer uses the standard proto codec.
//
// maxDescriptors and maxEntries, both above zero, are the service's bounds
// (service.Options' MaxDescriptors and MaxEntries, --max-descriptors and
// --max-entries). The codec allocates at most maxDescriptors+1 descriptors
// and maxEntries+1 entries per descriptor, skipping the rest, so a message
// of a million empty descriptors costs little, and the service's
// validation still sees that the request is past its bounds.
func NewCodec(maxDescriptors, maxEntries int) encoding.CodecV2 {
	return &requestCodec{
		proto:          encoding.GetCodecV2(grpcproto.Name),
		maxDescriptors: maxDescriptors,
		maxEntries:     maxEntries,
	}
}

type requestCodec struct {
	proto                      encoding.CodecV2
	maxDescriptors, maxEntries int
}

func (c *requestCodec) Name() string { return grpcproto.Name }

func (c *requestCodec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

func (c *requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*rlsv3.RateLimitRequest)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return c.decodeRequest(buf.ReadOnlyData(), req)
}

// decoder reads one message. Strings are cut from one copy of the whole
// message: one allocation per request instead of two per entry.
type decoder struct {
	all string // the message, copied once
	pos int    // where b starts in all
}

// field is one field read off b: its number, wire type, the whole field,
// tag included, and for a length-delimited field its value, in b and at
// start in all.
type field struct {
	num   protowire.Number
	typ   protowire.Type
	whole []byte
	value []byte
	start int
}

// next reads the field at the start of b and returns it and the rest of b.
func (d *decoder) next(b []byte) (field, []byte, error) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 {
		return field{}, nil, protowire.ParseError(n)
	}
	m := protowire.ConsumeFieldValue(num, typ, b[n:])
	if m < 0 {
		return field{}, nil, protowire.ParseError(m)
	}
	f := field{num: num, typ: typ, whole: b[:n+m]}
	if typ == protowire.BytesType {
		// The value after its length prefix.
		_, k := protowire.ConsumeVarint(b[n:])
		f.value, f.start = b[n+k:n+m], d.pos+n+k
	}
	d.pos += n + m
	return f, b[n+m:], nil
}

func (d *decoder) str(f field) string { return d.all[f.start : f.start+len(f.value)] }

// count returns how many length-delimited fields num there are in b, up to
// limit+1.
func count(b []byte, num protowire.Number, limit int) int {
	n := 0
	for len(b) > 0 && n <= limit {
		got, typ, k := protowire.ConsumeTag(b)
		if k < 0 {
			break
		}
		m := protowire.ConsumeFieldValue(got, typ, b[k:])
		if m < 0 {
			break
		}
		if got == num && typ == protowire.BytesType {
			n++
		}
		b = b[k+m:]
	}
	return n
}

func (c *requestCodec) decodeRequest(b []byte, req *rlsv3.RateLimitRequest) error {
	d := &decoder{all: string(b)}
	if n := count(b, requestDescriptors, c.maxDescriptors); n > 0 {
		req.Descriptors = make([]*rlcommon.RateLimitDescriptor, 0, n)
	}
	var other []byte
	for len(b) > 0 {
		f, rest, err := d.next(b)
		if err != nil {
			return fmt.Errorf("RateLimitRequest: %w", err)
		}
		b = rest
		switch {
		case f.typ != protowire.BytesType:
			other = append(other, f.whole...)
		case f.num == requestDomain:
			req.Domain = d.str(f)
		case f.num == requestDescriptors:
			if len(req.Descriptors) > c.maxDescriptors {
				continue // past the bound: validation refuses the request
			}
			desc := &rlcommon.RateLimitDescriptor{}
			if err := c.decodeDescriptor(d, f.start, f.value, desc); err != nil {
				return err
			}
			req.Descriptors = append(req.Descriptors, desc)
		default:
			other = append(other, f.whole...)
		}
	}
	if len(other) > 0 {
		return proto.UnmarshalOptions{Merge: true}.Unmarshal(other, req)
	}
	return nil
}

// decodeDescriptor decodes b, which starts at pos in d.all, into desc.
func (c *requestCodec) decodeDescriptor(parent *decoder, pos int, b []byte, desc *rlcommon.RateLimitDescriptor) error {
	d := &decoder{all: parent.all, pos: pos}
	var entries []rlcommon.RateLimitDescriptor_Entry
	if n := count(b, descriptorEntries, c.maxEntries); n > 0 {
		// One allocation for the entries, one for the pointers.
		entries = make([]rlcommon.RateLimitDescriptor_Entry, n)
		desc.Entries = make([]*rlcommon.RateLimitDescriptor_Entry, 0, n)
	}
	var other []byte
	for len(b) > 0 {
		f, rest, err := d.next(b)
		if err != nil {
			return fmt.Errorf("RateLimitDescriptor: %w", err)
		}
		b = rest
		if f.typ != protowire.BytesType || f.num != descriptorEntries {
			other = append(other, f.whole...)
			continue
		}
		if len(desc.Entries) > c.maxEntries {
			continue // past the bound: validation refuses the request
		}
		e := &entries[len(desc.Entries)]
		if err := decodeEntry(d, f.start, f.value, e); err != nil {
			return err
		}
		desc.Entries = append(desc.Entries, e)
	}
	if len(other) > 0 {
		return proto.UnmarshalOptions{Merge: true}.Unmarshal(other, desc)
	}
	return nil
}

// decodeEntry decodes b, which starts at pos in d.all, into e.
func decodeEntry(parent *decoder, pos int, b []byte, e *rlcommon.RateLimitDescriptor_Entry) error {
	d := &decoder{all: parent.all, pos: pos}
	var other []byte
	for len(b) > 0 {
		f, rest, err := d.next(b)
		if err != nil {
			return fmt.Errorf("RateLimitDescriptor.Entry: %w", err)
		}
		b = rest
		switch {
		case f.typ == protowire.BytesType && f.num == entryKey:
			e.Key = d.str(f)
		case f.typ == protowire.BytesType && f.num == entryValue:
			e.Value = d.str(f)
		default:
			other = append(other, f.whole...)
		}
	}
	if len(other) > 0 {
		return proto.UnmarshalOptions{Merge: true}.Unmarshal(other, e)
	}
	return nil
}
