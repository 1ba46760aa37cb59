//! The `poolgate` command. See `poolgate --help`.

fn main() -> std::process::ExitCode {
    poolgate::cli::main()
}
