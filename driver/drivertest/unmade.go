package drivertest

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmarena/vmarena/internal/errors"

	"github.com/vmarena/vmarena/driver"
)

// RequireUnmadeRefused calls every exported method of each driver in drvs
// — a nil pointer and a zero value of the driver's type, neither made by
// its constructor — with zero arguments, and fails the test if one panics
// or returns an error that is not ErrInvalid. Name may answer anything.
// A caller can write `var d host.Driver` or pass a nil *host.Driver on to
// a library; the driver must refuse, not fault.
func RequireUnmadeRefused(t *testing.T, drvs ...any) {
	t.Helper()
	for _, d := range drvs {
		v := reflect.ValueOf(d)
		typ := v.Type()
		require.Greater(t, typ.NumMethod(), 10, "%s: the driver's methods", typ)
		for i := range typ.NumMethod() {
			m := typ.Method(i)
			if m.Name == "Name" {
				continue
			}
			args := []reflect.Value{v}
			for j := 1; j < m.Type.NumIn(); j++ {
				args = append(args, reflect.Zero(m.Type.In(j)))
			}
			var out []reflect.Value
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Errorf("%s (nil: %v).%s panicked: %v", typ, v.IsNil(), m.Name, r)
					}
				}()
				out = m.Func.Call(args)
			}()
			for _, o := range out {
				if o.Type() != reflect.TypeFor[error]() {
					continue
				}
				err, _ := o.Interface().(error)
				require.Truef(t, errors.Is(err, driver.ErrInvalid), "%s (nil: %v).%s: %v, want ErrInvalid", typ, v.IsNil(), m.Name, err)
			}
		}
	}
}
