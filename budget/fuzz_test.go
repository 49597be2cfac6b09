package budget

import (
	"testing"
)

// FuzzDecode: any bytes decode to books that keep every invariant, or to
// an error; never a panic.
func FuzzDecode(f *testing.F) {
	good := make([]byte, copy1+stateSize)
	encodeHeader(good, 1<<30)
	s := &state{gen: 3, capacity: 1 << 30}
	s.recs[0] = record{used: true, pid: 1, token: 9, floor: 1 << 20, ceiling: 1 << 29, hold: 1 << 28, idle: 1 << 27, name: "a"}
	s.recs[5] = record{used: true, pid: 2, token: 10, ceiling: 1 << 30, hold: 1 << 20, name: "b"}
	encodeState(good[copy0:], s)
	f.Add(good)
	f.Add(good[:100])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		st, _, err := decode(b)
		if err != nil {
			return
		}
		if st.reservedSum() > st.capacity {
			t.Fatalf("over-committed books decoded")
		}
		for i := range st.recs {
			r := &st.recs[i]
			if r.used && (r.floor > r.ceiling || r.hold > r.ceiling || r.idle > r.hold || r.ceiling > st.capacity || checkName(r.name) != nil) {
				t.Fatalf("slot %d breaks a rule: %+v", i, *r)
			}
		}
		// What decoded encodes to what decodes the same.
		out := make([]byte, copy1+stateSize)
		copy(out, b[:headerSize])
		encodeState(out[copy0:], st)
		again, _, err := decode(out)
		if err != nil || *again != *st {
			t.Fatalf("round trip: %v", err)
		}
	})
}
