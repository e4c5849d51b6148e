! A Fortran program writing a file through the gfortran runtime (its own
! buffering, open and close), for the shim tests.
program write_file
  implicit none
  integer :: i, u
  open(newunit=u, file='fortran.dat', status='replace', action='write')
  do i = 1, 100
    write(u, '(a, i0)') 'line ', i
  end do
  close(u)
end program write_file
