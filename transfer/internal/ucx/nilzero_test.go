package ucx

import (
	"fmt"
	"reflect"
	"testing"
)

// TestNilAndZeroReceivers calls every exported method of Worker, Mem,
// Endpoint and Window on a nil pointer and on a pointer to the zero value, every
// argument its zero value (internal/apitest's test, which cannot import an
// internal package of transfer): none may panic or hang, and each must
// answer an error.
func TestNilAndZeroReceivers(t *testing.T) {
	for _, typ := range []reflect.Type{reflect.TypeFor[Worker](), reflect.TypeFor[Mem](), reflect.TypeFor[Endpoint](), reflect.TypeFor[Window]()} {
		ptr := reflect.PointerTo(typ)
		for i := range ptr.NumMethod() {
			m := ptr.Method(i)
			for _, recv := range []reflect.Value{reflect.Zero(ptr), reflect.New(typ)} {
				name := fmt.Sprintf("%s.%s on a %s", typ, m.Name, map[bool]string{true: "nil", false: "zero value"}[recv.IsNil()])
				args := []reflect.Value{recv}
				for j := 1; j < m.Type.NumIn(); j++ {
					args = append(args, reflect.Zero(m.Type.In(j)))
				}
				done := make(chan any, 1)
				go func() {
					defer func() {
						if r := recover(); r != nil {
							done <- fmt.Sprintf("panicked: %v", r)
						}
					}()
					out := m.Func.Call(args)
					done <- out[len(out)-1].Interface()
				}()
				// A call that never returns hangs here until go test's
				// -timeout, its stack shown.
				if r := <-done; r == nil {
					t.Errorf("%s answered nil, not an error", name)
				} else if _, ok := r.(error); !ok {
					t.Errorf("%s answered %v, not an error", name, r)
				}
			}
		}
	}
}
