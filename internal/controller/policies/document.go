package policies

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/redline-dev/redline/api/v1alpha1"
	"github.com/redline-dev/redline/internal/policydoc"
)

// MaxConfigMapBytes is what the API server lets a ConfigMap's data and binaryData hold
// together (1 MiB, the limit it shares with Secrets).
const MaxConfigMapBytes = 1 << 20

// payload is the document as the ConfigMap carries it.
type payload struct {
	data   map[string]string
	binary map[string][]byte
}

// sized is one compiled policy with what orders it when not all of them fit: the oldest
// policies are kept, so that a new one never pushes out those already enforced.
type sized struct {
	policy policydoc.Policy
	// order sorts the policies oldest first (creation time, then name).
	order string
}

// encodeDocument picks the ConfigMap form of a document: plain JSON under policies.json while
// it fits, which every sidecar version reads and kubectl shows, else gzip under
// policies.json.gz (JSON compresses about tenfold). A document that is over what the default
// sidecar loads (policydoc.MaxDocumentBytes, whatever its compressed size), or that fits a
// ConfigMap neither way, is an error that names the sizes, the policies that do not fit and
// what to do; nothing is written, so the ConfigMap in place stays in force.
func encodeDocument(ns string, doc *policydoc.Document, data []byte, limit int, current *corev1.ConfigMap, policies ...sized) (payload, error) {
	if len(data) > policydoc.MaxDocumentBytes {
		return payload{}, tooLarge(doc, current, v1alpha1.ReasonDocumentTooLarge, fmt.Sprintf(
			"the policies of namespace %s compile to %d bytes, over the %d bytes a sidecar loads within its default memory limit",
			ns, len(data), policydoc.MaxDocumentBytes), notFitting(ns, doc, policies, policydoc.MaxDocumentBytes))
	}
	if len(data) <= limit {
		return payload{data: map[string]string{policydoc.DataKey: string(data)}}, nil
	}
	gz, err := compress(data)
	if err != nil {
		return payload{}, fmt.Errorf("compressing policies of %s: %w", ns, err)
	}
	if len(gz) <= limit {
		return payload{binary: map[string][]byte{policydoc.GzipDataKey: gz}}, nil
	}
	return payload{}, tooLarge(doc, current, v1alpha1.ReasonConfigMapTooLarge, fmt.Sprintf(
		"the policies of namespace %s compile to %d bytes (%d gzip-compressed), over the %d bytes a ConfigMap holds",
		ns, len(data), len(gz), limit), notFitting(ns, doc, policies, limit))
}

func compress(data []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(data); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func tooLarge(doc *policydoc.Document, current *corev1.ConfigMap, reason, sizes string, left []string) error {
	rules := 0
	for _, p := range doc.Policies {
		rules += len(p.Rules)
	}
	inForce := "no ConfigMap exists yet, so none of them is enforced"
	if current != nil {
		inForce = fmt.Sprintf("ConfigMap %s keeps the last configuration that fit (hash %.12s) in force", policydoc.ConfigMapName, current.Annotations[HashAnnotation])
	}
	fit := ""
	if len(left) > 0 {
		const shown = 10
		names := left
		if len(names) > shown {
			names = append(slices.Clone(names[:shown]), fmt.Sprintf("and %d more", len(left)-shown))
		}
		fit = fmt.Sprintf("; these policies do not fit (the oldest are kept first): %s", strings.Join(names, ", "))
	}
	return &tenantError{reason: reason, err: fmt.Errorf(
		"%s; %s%s. Remove or merge policies or rules (%d policies, %d rules now), or split the workloads across namespaces",
		sizes, inForce, fit, len(doc.Policies), rules)}
}

// notFitting names the policies left out when, oldest first, each policy is kept while the
// document stays within budget bytes (a policy too large on its own does not stop the younger
// ones that fit). A document's size is additive in its policies (each is encoded on its own,
// at the same indent, with one separator between), so each policy is measured once, in a
// document of its own, and the document the kept ones make is built once to check.
func notFitting(ns string, doc *policydoc.Document, policies []sized, budget int) []string {
	if len(policies) == 0 {
		return nil
	}
	ordered := slices.Clone(policies)
	slices.SortFunc(ordered, func(a, b sized) int { return strings.Compare(a.order, b.order) })
	alone := make([]int, len(ordered))
	for i := range ordered {
		_, data, err := policydoc.Build(ns, []policydoc.Policy{ordered[i].policy}, doc.Scripts)
		if err != nil {
			return nil
		}
		alone[i] = len(data)
	}
	// overhead is what every one-policy document repeats: the document around its policy.
	overhead := 0
	if len(ordered) > 1 {
		_, two, err := policydoc.Build(ns, []policydoc.Policy{ordered[0].policy, ordered[1].policy}, doc.Scripts)
		if err != nil {
			return nil
		}
		overhead = alone[0] + alone[1] + len(",") - len(two)
	}
	var kept []policydoc.Policy
	var out []string
	size := 0
	for i, p := range ordered {
		next := alone[i]
		if len(kept) > 0 {
			next = size + alone[i] - overhead + len(",")
		}
		if next > budget {
			out = append(out, p.policy.Name)
			continue
		}
		kept, size = append(kept, p.policy), next
	}
	if len(kept) > 0 {
		if _, data, err := policydoc.Build(ns, kept, doc.Scripts); err != nil || len(data) != size {
			return nil // the arithmetic no longer matches the encoding: name none rather than wrong ones
		}
	}
	return out
}

func (p payload) apply(cm *corev1.ConfigMap) {
	cm.Data, cm.BinaryData = p.data, p.binary
}

// contentDigestAnnotation holds, in the manager's cache only, the digest of a cached
// ConfigMap's data and binaryData, which the cache drops (slimConfigMap): the manager compares
// what it would write with what is there without holding, decompressing or parsing the
// tenant's bytes. It is never written: updates are built from what the manager owns.
const contentDigestAnnotation = "redline.dev/cached-content-sha256"

// contentDigest is the SHA-256 of a ConfigMap's data and binaryData, each key and value
// length-prefixed so that no two contents share a digest.
func contentDigest(data map[string]string, bin map[string][]byte) string {
	h := sha256.New()
	field := func(kind byte, k string, v []byte) {
		var n [8]byte
		h.Write([]byte{kind})
		binary.BigEndian.PutUint64(n[:], uint64(len(k)))
		h.Write(n[:])
		_, _ = io.WriteString(h, k)
		binary.BigEndian.PutUint64(n[:], uint64(len(v)))
		h.Write(n[:])
		h.Write(v)
	}
	for _, k := range slices.Sorted(maps.Keys(data)) {
		field('d', k, []byte(data[k]))
	}
	for _, k := range slices.Sorted(maps.Keys(bin)) {
		field('b', k, bin[k])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// digestOf is a ConfigMap's content digest: the cache's record of it, or computed from the
// content when the object was read whole.
func digestOf(cm *corev1.ConfigMap) string {
	if cm.Data == nil && cm.BinaryData == nil {
		if d, ok := cm.Annotations[contentDigestAnnotation]; ok {
			return d
		}
	}
	return contentDigest(cm.Data, cm.BinaryData)
}

// matches reports whether the ConfigMap carries exactly this payload.
func (p payload) matches(cm *corev1.ConfigMap) bool {
	return digestOf(cm) == contentDigest(p.data, p.binary)
}

// documentOf returns the document bytes a ConfigMap carries, in either form, bounded before
// anything is allocated for them: a ConfigMap is tenant-writable, and a few KiB of gzip expand
// to gigabytes. Nothing larger than what the controller writes (policydoc.MaxDocumentBytes) is
// read.
func documentOf(cm *corev1.ConfigMap) ([]byte, error) {
	if gz, ok := cm.BinaryData[policydoc.GzipDataKey]; ok {
		if len(gz) > MaxConfigMapBytes {
			return nil, fmt.Errorf("reading configmap %s/%s: %d compressed bytes, over the %d the controller writes", cm.Namespace, cm.Name, len(gz), MaxConfigMapBytes)
		}
		data, err := policydoc.Decompress(gz)
		if err != nil {
			return nil, fmt.Errorf("reading configmap %s/%s: %w", cm.Namespace, cm.Name, err)
		}
		return data, nil
	}
	data := cm.Data[policydoc.DataKey]
	if len(data) > policydoc.MaxDocumentBytes {
		return nil, fmt.Errorf("reading configmap %s/%s: %d bytes, over the %d the controller writes", cm.Namespace, cm.Name, len(data), policydoc.MaxDocumentBytes)
	}
	return []byte(data), nil
}
