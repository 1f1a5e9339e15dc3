from app.cli import program

program()
