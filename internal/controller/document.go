package controller

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"

	"github.com/redline-dev/redline/internal/policydoc"
)

// MaxConfigMapBytes is what the API server lets a ConfigMap's data and binaryData hold
// together (1 MiB, the limit it shares with Secrets).
const MaxConfigMapBytes = 1 << 20

// ReasonConfigMapTooLarge is the Programmed reason of a namespace whose policies do not fit.
const ReasonConfigMapTooLarge = "ConfigMapTooLarge"

// payload is the document as the ConfigMap carries it.
type payload struct {
	data   map[string]string
	binary map[string][]byte
}

// encodeDocument picks the ConfigMap form of a document: plain JSON under policies.json while
// it fits, which every sidecar version reads and kubectl shows, else gzip under
// policies.json.gz (JSON compresses about tenfold). A document that fits neither way is an
// error that names the sizes and what to do; nothing is written, so the ConfigMap in place
// stays in force.
func encodeDocument(ns string, doc *policydoc.Document, data []byte, limit int, current *corev1.ConfigMap) (payload, error) {
	if len(data) <= limit {
		return payload{data: map[string]string{policydoc.DataKey: string(data)}}, nil
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return payload{}, fmt.Errorf("compressing policies of %s: %w", ns, err)
	}
	if _, err := zw.Write(data); err != nil {
		return payload{}, fmt.Errorf("compressing policies of %s: %w", ns, err)
	}
	if err := zw.Close(); err != nil {
		return payload{}, fmt.Errorf("compressing policies of %s: %w", ns, err)
	}
	if buf.Len() <= limit {
		return payload{binary: map[string][]byte{policydoc.GzipDataKey: buf.Bytes()}}, nil
	}
	rules := 0
	for _, p := range doc.Policies {
		rules += len(p.Rules)
	}
	inForce := "no ConfigMap exists yet, so none of them is enforced"
	if current != nil {
		inForce = fmt.Sprintf("ConfigMap %s keeps the last configuration that fit (hash %.12s) in force", policydoc.ConfigMapName, current.Annotations[HashAnnotation])
	}
	return payload{}, &tenantError{reason: ReasonConfigMapTooLarge, err: fmt.Errorf(
		"the policies of namespace %s compile to %d bytes (%d gzip-compressed), over the %d bytes a ConfigMap holds; %s. "+
			"Remove or merge policies or rules (%d policies, %d rules now), or split the workloads across namespaces",
		ns, len(data), buf.Len(), limit, inForce, len(doc.Policies), rules)}
}

func (p payload) apply(cm *corev1.ConfigMap) {
	cm.Data, cm.BinaryData = p.data, p.binary
}

func (p payload) matches(cm *corev1.ConfigMap) bool {
	return maps.Equal(cm.Data, p.data) && maps.EqualFunc(cm.BinaryData, p.binary, bytes.Equal)
}

// documentOf returns the document bytes a ConfigMap carries, in either form.
func documentOf(cm *corev1.ConfigMap) ([]byte, error) {
	if gz, ok := cm.BinaryData[policydoc.GzipDataKey]; ok {
		data, err := policydoc.Decompress(gz)
		if err != nil {
			return nil, fmt.Errorf("reading configmap %s/%s: %w", cm.Namespace, cm.Name, err)
		}
		return data, nil
	}
	return []byte(cm.Data[policydoc.DataKey]), nil
}
