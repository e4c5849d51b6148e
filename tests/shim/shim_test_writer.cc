// Programs for the shim tests that no standard tool is: threads, forked
// children, remove(), vfork, closing every descriptor, files left open at
// exit. Plain C library calls only, as a C program makes them. Exits 0 when
// every call it made succeeded; prints what failed otherwise.
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

extern char** environ;

namespace {

bool g_failed = false;

void Check(bool ok, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "%s: %s\n", what.c_str(), std::strerror(errno));
    g_failed = true;
  }
}

// open, write `content`, close.
void WriteFile(const std::string& path, const std::string& content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  Check(fd >= 0, "open " + path);
  if (fd < 0) return;
  Check(::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size()),
        "write " + path);
  Check(::close(fd) == 0, "close " + path);
}

struct ThreadArgs {
  std::string dir;
  int thread;
  int files;
  pthread_barrier_t* start;
};

void* ThreadMain(void* p) {
  const auto* a = static_cast<ThreadArgs*>(p);
  // Every thread makes its first call together (the shim's first use in
  // the process, when main made none before).
  ::pthread_barrier_wait(a->start);
  for (int i = 0; i < a->files; ++i) {
    WriteFile(a->dir + "/t" + std::to_string(a->thread) + "_" + std::to_string(i),
              "thread " + std::to_string(a->thread) + " file " + std::to_string(i) + "\n");
  }
  return nullptr;
}

int Usage() {
  std::fprintf(stderr,
               "usage: shim_test_writer threads DIR THREADS FILES\n"
               "       shim_test_writer fork DIR CHILDREN FILES\n"
               "       shim_test_writer remove PATH...\n"
               "       shim_test_writer vfork DIR\n"
               "       shim_test_writer closeall DIR\n"
               "       shim_test_writer openexit DIR (return|_exit)\n"
               "       shim_test_writer exec DIR (execl|execle|execlp|execv|execve|execvp|\n"
               "                                  execvpe|execveat|fexecve)\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Usage();
  const std::string mode = argv[1];
  const std::string dir = argv[2];
  if (mode == "threads" && argc == 5) {
    const int threads = std::atoi(argv[3]);
    std::vector<pthread_t> ids(static_cast<size_t>(threads));
    std::vector<ThreadArgs> args(static_cast<size_t>(threads));
    pthread_barrier_t start;
    ::pthread_barrier_init(&start, nullptr, static_cast<unsigned>(threads));
    for (int t = 0; t < threads; ++t) {
      args[static_cast<size_t>(t)] = ThreadArgs{dir, t, std::atoi(argv[4]), &start};
      Check(::pthread_create(&ids[static_cast<size_t>(t)], nullptr, ThreadMain,
                             &args[static_cast<size_t>(t)]) == 0,
            "pthread_create");
    }
    for (pthread_t id : ids) ::pthread_join(id, nullptr);
  } else if (mode == "fork" && argc == 5) {
    const int children = std::atoi(argv[3]);
    const int files = std::atoi(argv[4]);
    WriteFile(dir + "/parent_before", "before the forks\n");
    std::vector<pid_t> pids;
    for (int c = 0; c < children; ++c) {
      const pid_t pid = ::fork();
      if (pid == 0) {
        for (int i = 0; i < files; ++i) {
          WriteFile(dir + "/c" + std::to_string(c) + "_" + std::to_string(i), "child\n");
        }
        // One file each child leaves open: posted at its exit.
        FILE* f = std::fopen((dir + "/c" + std::to_string(c) + "_open").c_str(), "w");
        Check(f != nullptr, "fopen");
        if (f != nullptr) {
          std::fprintf(f, "left open by child %d\n", c);
          std::fflush(f);
        }
        std::exit(g_failed ? 1 : 0);
      }
      pids.push_back(pid);
    }
    for (pid_t pid : pids) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      Check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child");
    }
    WriteFile(dir + "/parent_after", "after the children\n");
  } else if (mode == "remove") {
    for (int i = 2; i < argc; ++i) Check(std::remove(argv[i]) == 0, std::string("remove ") + argv[i]);
  } else if (mode == "vfork") {
    WriteFile(dir + "/before_vfork", "1\n");
    const pid_t pid = ::vfork();
    if (pid == 0) {
      // What a vfork child may do: descriptor calls and exec or _exit.
      ::close(100);
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    Check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "vfork child");
    WriteFile(dir + "/after_vfork", "2\n");
  } else if (mode == "closeall") {
    // The first post opens the shim's connection; then every descriptor
    // above 2 is closed, twice over (close_range, then close in a loop, as
    // daemons do); the files opened next get the connection's numbers.
    WriteFile(dir + "/first", "first\n");
    Check(::close_range(3, ~0U, 0) == 0, "close_range");
    WriteFile(dir + "/second", "second\n");
    for (int fd = 3; fd < 1024; ++fd) ::close(fd);
    WriteFile(dir + "/third", "third\n");
    const int a = ::open((dir + "/fourth").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int b = ::open((dir + "/fifth").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    Check(a >= 0 && b >= 0, "open fourth, fifth");
    Check(::write(a, "fourth\n", 7) == 7 && ::write(b, "fifth\n", 6) == 6, "write");
    WriteFile(dir + "/sixth", "sixth\n");  // posts while fourth and fifth are open
    Check(::write(a, "more\n", 5) == 5, "write fourth");
    Check(::close(a) == 0 && ::close(b) == 0, "close");
  } else if (mode == "openexit" && argc == 4) {
    const int fd = ::open((dir + "/left_open").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    Check(fd >= 0 && ::write(fd, "never closed\n", 13) == 13, "open, write");
    if (std::string(argv[3]) == "_exit") ::_exit(g_failed ? 1 : 0);
  } else if (mode == "exec" && argc == 4) {
    // A file written through a close-on-exec descriptor that is never
    // closed: the exec closes it. A fork child execs first while it is open
    // (the child's copy is the parent's file: not posted then), then the
    // parent writes more, opens a second file without close-on-exec (the
    // new program inherits it) and execs /bin/true.
    const std::string variant = argv[3];
    const int fd = ::open((dir + "/cloexec").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    Check(fd >= 0 && ::write(fd, "first\n", 6) == 6, "open, write cloexec");
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execl("/bin/true", "true", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    Check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "forked child's exec");
    Check(::write(fd, "second\n", 7) == 7, "write cloexec");
    const int kept = ::open((dir + "/inherited").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    Check(kept >= 0 && ::write(kept, "inherited\n", 10) == 10, "open, write inherited");
    if (g_failed) return 1;
    char true_name[] = "true";
    char* const args[] = {true_name, nullptr};
    if (variant == "execl") {
      ::execl("/bin/true", "true", static_cast<char*>(nullptr));
    } else if (variant == "execle") {
      ::execle("/bin/true", "true", static_cast<char*>(nullptr), environ);
    } else if (variant == "execlp") {
      ::execlp("true", "true", static_cast<char*>(nullptr));
    } else if (variant == "execv") {
      ::execv("/bin/true", args);
    } else if (variant == "execve") {
      ::execve("/bin/true", args, environ);
    } else if (variant == "execvp") {
      ::execvp("true", args);
    } else if (variant == "execvpe") {
      ::execvpe("true", args, environ);
    } else if (variant == "execveat") {
      ::execveat(AT_FDCWD, "/bin/true", args, environ, 0);
    } else if (variant == "fexecve") {
      const int exe = ::open("/bin/true", O_RDONLY | O_CLOEXEC);
      Check(exe >= 0, "open /bin/true");
      ::fexecve(exe, args, environ);
    } else {
      return Usage();
    }
    Check(false, variant);
    return 1;
  } else {
    return Usage();
  }
  return g_failed ? 1 : 0;
}
