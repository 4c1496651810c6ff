package envoyrlqs

import "encoding/binary"

// maxStackKeys is how many keys a bucket id may have before sorting them
// allocates; Envoy's bucket ids have a handful.
const maxStackKeys = 16

// appendKey appends the bucket id's canonical form to dst: its pairs in byte
// order of key, each string length-prefixed, so two maps with the same pairs
// give the same key and different ones never do (Envoy compares
// MessageUtil::hash of the BucketId, which serializes the map sorted).
func appendKey(dst []byte, bucket map[string]string) []byte {
	var stack [maxStackKeys]string
	keys := stack[:0]
	for k := range bucket {
		keys = append(keys, k)
	}
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && keys[j] < keys[j-1]; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	for _, k := range keys {
		v := bucket[k]
		dst = binary.AppendUvarint(dst, uint64(len(k)))
		dst = append(dst, k...)
		dst = binary.AppendUvarint(dst, uint64(len(v)))
		dst = append(dst, v...)
	}
	return dst
}

// bucketKey is appendKey as a string, for the paths that keep it.
func bucketKey(bucket map[string]string) string {
	return string(appendKey(nil, bucket))
}
