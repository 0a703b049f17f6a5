package fleet

// A policy's per-decision annotation: figures it wants the request log and
// GET /internal/decision/<id> to show with the decision (a predicted TTFT).
// The policy declares the keys once (Annotator) and writes the values into
// its Choice's Notes by key index; the decision ledger copies the values
// with the decision (a few words, no allocation) and the log line names
// them by the keys of the policy that decided. The pipeline above never
// names a policy's outputs.

// MaxNotes is how many figures one decision carries.
const MaxNotes = 2

// Notes are the figures a policy wrote for one decision: value i belongs
// to the policy's declared key i (Annotator.NoteKeys) and is logged only
// when set. The zero value has none.
type Notes struct {
	set uint8 // bit i: v[i] is set
	v   [MaxNotes]float32
}

// Set sets the figure of declared key i (0 <= i < MaxNotes).
func (n *Notes) Set(i int, v float32) {
	n.set |= 1 << i
	n.v[i] = v
}

// Get returns the figure of declared key i and whether it is set.
func (n *Notes) Get(i int) (float32, bool) {
	if i < 0 || i >= MaxNotes || n.set&(1<<i) == 0 {
		return 0, false
	}
	return n.v[i], true
}

// Annotator is implemented by policies that write Notes: NoteKeys are the
// log field names of their figures, by index (at most MaxNotes, fixed for
// the policy's life, never a field the request log writes itself).
type Annotator interface {
	NoteKeys() []string
}

// Note is one figure as the request log writes it.
type Note struct {
	Key   string
	Value float64
}

// NoteList is a decision's figures named by their keys, in key order.
type NoteList struct {
	N    int
	List [MaxNotes]Note
}

// Name names n's set figures by the keys of the policy p that wrote them
// (none when p declares no keys).
func (n *Notes) Name(p Policy) NoteList {
	var out NoteList
	a, ok := p.(Annotator)
	if !ok || n.set == 0 {
		return out
	}
	for i, k := range a.NoteKeys() {
		if v, ok := n.Get(i); ok {
			out.List[out.N] = Note{Key: k, Value: float64(v)}
			out.N++
		}
	}
	return out
}

// Get returns the value of the figure named key.
func (l *NoteList) Get(key string) (float64, bool) {
	for _, n := range l.List[:l.N] {
		if n.Key == key {
			return n.Value, true
		}
	}
	return 0, false
}
